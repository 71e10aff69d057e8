"""Cross-lingual retrieval: English passages, the same questions asked in English, German, French and Spanish, on
an index built with each embedder (real LanceDB tables through the worker's Store, vector leg and hybrid).

    .venv/bin/python -m bench.crosslingual

Prints, per embedder and question language, Hit@1 and MRR@10 (the passage each question was written for is
its one relevant document). The English row is the baseline in the same run: a multilingual embedder should keep
the other languages close to it, while MiniLM (English only) misses most of them. The corpus and the questions
are written for this bench (an HR / office handbook, 12 passages), not taken from a dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

PASSAGES = [
    "Employees are entitled to 25 days of paid vacation per calendar year.",
    "Unused vacation days can be carried over until the end of March of the following year.",
    "A doctor's note is required after three consecutive days of sick leave.",
    "The office opens at 8 am and closes at 6 pm on weekdays.",
    "Visitors must sign in at the reception desk and wear a badge at all times.",
    "Either party may terminate the employment contract with three months written notice.",
    "Travel expenses are reimbursed within 30 days when the receipts are submitted.",
    "Employees may work from home up to two days per week with their manager's approval.",
    "Parking spaces in the underground garage are assigned by the facilities team each quarter.",
    "New laptops are issued by the IT department and must be encrypted before first use.",
    "Parental leave lasts up to sixteen weeks and is paid at full salary.",
    "Fire drills take place twice a year; everyone gathers at the assembly point in the car park.",
]
QUESTIONS = {
    "en": [
        "How many days of paid holiday do employees get each year?",
        "Until when can I carry over vacation days I did not take?",
        "When do I need a medical certificate for sick leave?",
        "What are the office opening hours?",
        "What must visitors do when they arrive?",
        "What is the notice period to end the contract?",
        "How quickly are travel costs paid back?",
        "How many days a week can I work remotely?",
        "Who assigns the parking spaces in the garage?",
        "What must be done with a new laptop before using it?",
        "How long is parental leave?",
        "Where do we gather during a fire drill?",
    ],
    "de": [
        "Wie viele bezahlte Urlaubstage bekommen Mitarbeiter pro Jahr?",
        "Bis wann kann ich nicht genommene Urlaubstage übertragen?",
        "Wann brauche ich bei Krankheit ein ärztliches Attest?",
        "Wann hat das Büro geöffnet?",
        "Was müssen Besucher bei ihrer Ankunft tun?",
        "Wie lang ist die Kündigungsfrist des Arbeitsvertrags?",
        "Wie schnell werden Reisekosten erstattet?",
        "Wie viele Tage pro Woche darf ich im Homeoffice arbeiten?",
        "Wer vergibt die Parkplätze in der Tiefgarage?",
        "Was muss man mit einem neuen Laptop vor der ersten Nutzung tun?",
        "Wie lange dauert die Elternzeit?",
        "Wo versammeln wir uns bei einer Feuerübung?",
    ],
    "fr": [
        "Combien de jours de congés payés les salariés ont-ils par an ?",
        "Jusqu'à quand puis-je reporter mes jours de congé non pris ?",
        "Quand faut-il un certificat médical en cas d'arrêt maladie ?",
        "Quels sont les horaires d'ouverture du bureau ?",
        "Que doivent faire les visiteurs à leur arrivée ?",
        "Quel est le préavis pour mettre fin au contrat ?",
        "En combien de temps les frais de déplacement sont-ils remboursés ?",
        "Combien de jours par semaine puis-je télétravailler ?",
        "Qui attribue les places de parking du garage ?",
        "Que faut-il faire avec un nouvel ordinateur portable avant de l'utiliser ?",
        "Combien de temps dure le congé parental ?",
        "Où se rassemble-t-on lors d'un exercice d'incendie ?",
    ],
    "es": [
        "¿Cuántos días de vacaciones pagadas tienen los empleados al año?",
        "¿Hasta cuándo puedo trasladar los días de vacaciones no disfrutados?",
        "¿Cuándo necesito un certificado médico por baja por enfermedad?",
        "¿Cuál es el horario de apertura de la oficina?",
        "¿Qué deben hacer los visitantes al llegar?",
        "¿Cuál es el plazo de preaviso para terminar el contrato?",
        "¿En cuánto tiempo se reembolsan los gastos de viaje?",
        "¿Cuántos días a la semana puedo teletrabajar?",
        "¿Quién asigna las plazas de aparcamiento del garaje?",
        "¿Qué hay que hacer con un portátil nuevo antes de usarlo?",
        "¿Cuánto dura el permiso parental?",
        "¿Dónde nos reunimos durante un simulacro de incendio?",
    ],
}
EMBEDDERS = ("default", "multilingual-e5-small")


def rows() -> list[dict]:
    out = []
    for i, text in enumerate(PASSAGES):
        out.append(
            {
                "document_id": hashlib.sha256(text.encode()).hexdigest(),
                "filename": f"p{i:02d}.md",
                "dataset": "default",
                "page": None,
                "chunk_index": 0,
                "text": text,
                "metadata": {},
            }
        )
    return out


def measure(store, index: str, mode: str) -> dict[str, tuple[float, float, float]]:
    """{language: (Hit@1, MRR@10, ms/query)}"""
    out = {}
    for lang, questions in QUESTIONS.items():
        hits1 = rr = 0.0
        t0 = time.perf_counter()
        for want, question in enumerate(questions):
            names = [h.filename for h in store.search(index, question, mode=mode, limit=10)]
            name = f"p{want:02d}.md"
            hits1 += bool(names) and names[0] == name
            rr += 1.0 / (names.index(name) + 1) if name in names else 0.0
        ms = 1000 * (time.perf_counter() - t0) / len(questions)
        out[lang] = (hits1 / len(questions), rr / len(questions), ms)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modes", nargs="+", default=["vector", "hybrid"], choices=("vector", "hybrid", "fts")
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-xling-") as tmp:
        settings = Settings(INDEX_STORE=str(Path(tmp) / "store"))
        services = Services(settings)
        store = services.store
        lines = [
            "| embedder | mode | questions | Hit@1 | MRR@10 | ms/query |",
            "|---|---|---|---:|---:|---:|",
        ]
        for name in EMBEDDERS:
            index = name.replace("-", "_")
            store.create_index(index, embedder=name)
            t0 = time.perf_counter()
            store.add_chunks(index, rows())
            print(f"{name}: {len(PASSAGES)} passages in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            for mode in args.modes:
                for lang, (h1, mrr, ms) in measure(store, index, mode).items():
                    lines.append(f"| {name} | {mode} | {lang} | {h1:.2f} | {mrr:.2f} | {ms:.0f} |")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
