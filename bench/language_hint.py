"""When the interface's language (the turn's `options.language`) decides the answer's language: the thresholds of
rag_worker/i18n.choose (a detection is sure at MIN_CONFIDENCE and RATIO times the runner-up) swept over questions
written for it. `kept`: questions in en/fr/de/es answered in their own language although the hint names another
(the hint must not win over a clear question); `short`: one- or two-word messages ("merci ?", "Danke", a name)
answered in the language of the interface they were typed in. Accuracy only, no timing.

    PYTHONPATH=. .venv/bin/python -m bench.language_hint
"""

from __future__ import annotations

import rag_worker.i18n as i18n

QUESTIONS = {
    "en": [
        "How many vacation days do I get?", "Where is the parking?", "Who approves expenses?", "What is the deadline?",
        "Is parking free?", "When does the office open?", "Can I work from home?",
        "What does the contract say about notice?",
    ],
    "fr": [
        "Combien de jours de congé ai-je ?", "Où est le parking ?", "Qui valide les notes de frais ?",
        "Quelle est la date limite ?", "Le parking est-il gratuit ?", "À quelle heure ouvre le bureau ?",
        "Puis-je télétravailler ?", "Que dit le contrat sur le préavis ?",
    ],
    "de": [
        "Wie viele Urlaubstage habe ich?", "Wo ist der Parkplatz?", "Wer genehmigt Spesen?", "Was ist die Frist?",
        "Ist das Parken kostenlos?", "Wann öffnet das Büro?", "Kann ich von zu Hause arbeiten?",
        "Was sagt der Vertrag zur Kündigung?",
    ],
    "es": [
        "¿Cuántos días de vacaciones tengo?", "¿Dónde está el aparcamiento?", "¿Quién aprueba los gastos?",
        "¿Cuál es el plazo?", "¿El aparcamiento es gratis?", "¿Cuándo abre la oficina?",
        "¿Puedo trabajar desde casa?", "¿Qué dice el contrato sobre el preaviso?",
    ],
}  # fmt: skip
CONTRARY = {"en": "fr", "fr": "en", "de": "fr", "es": "en"}
SHORT = {
    "merci ?": "fr", "merci": "fr", "ok merci": "fr", "d accord": "fr", "Jean Dupont": "fr", "bien sûr": "fr",
    "oui": "fr", "Paris": "fr", "Danke": "de", "Und?": "de", "genau": "de", "gracias": "es", "vale": "es",
    "claro": "es", "sure": "en", "yes": "en", "ok": "en",
}  # fmt: skip


def main() -> None:
    chosen = (i18n.MIN_CONFIDENCE, i18n.RATIO)
    total = sum(map(len, QUESTIONS.values()))
    print("| min confidence | ratio | kept against a contrary hint | short, with their interface's hint |")
    print("|---:|---:|---:|---:|")
    for conf in (0.2, 0.25, 0.3):
        for ratio in (1.3, 1.5, 2.0):
            i18n.MIN_CONFIDENCE, i18n.RATIO = conf, ratio
            kept = sum(
                i18n.choose(q, CONTRARY[lang])[0] == lang for lang, qs in QUESTIONS.items() for q in qs
            )
            short = sum(i18n.choose(q, lang)[0] == lang for q, lang in SHORT.items())
            mark = " (chosen)" if (conf, ratio) == chosen else ""
            print(f"| {conf}{mark} | {ratio} | {kept}/{total} | {short}/{len(SHORT)} |")
    i18n.MIN_CONFIDENCE, i18n.RATIO = chosen
    for lang, qs in QUESTIONS.items():
        for q in qs:
            code, source = i18n.choose(q, CONTRARY[lang])
            if code != lang:
                print(f"lost at the chosen thresholds: {q!r} ({lang}) -> {code} ({source})")


if __name__ == "__main__":
    main()
