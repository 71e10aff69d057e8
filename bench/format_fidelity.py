"""Fidelity of the mail, legacy office and e-book conversions: token F1 against the same content in its source.

    .venv/bin/python -m bench.format_fidelity

The samples of tests/format_samples.py are written once as .docx/.xlsx/.pptx and converted by LibreOffice into
.doc/.rtf/.odt, .xls/.ods and .ppt/.odp. Each converted file goes through our converter and is compared with our
conversion of its Office Open XML original (token precision/recall/F1, order ignored) and by the tables Docling
found. The EPUB and e-mails are compared with the text they were built from. Needs LibreOffice.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests import format_samples as fs

TOKEN = re.compile(r"\w+", re.UNICODE)
HEADER_WORDS = {"from", "to", "date", "attachments", "subject"}


def tokens(text: str) -> Counter:
    return Counter(t.lower() for t in TOKEN.findall(text.replace("_", " ")))


def f1(ours: Counter, truth: Counter) -> tuple[float, float, float]:
    common = sum((ours & truth).values())
    p = common / max(1, sum(ours.values()))
    r = common / max(1, sum(truth.values()))
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def main() -> None:
    from rag_worker.ingest.convert import Converter

    converter = Converter()
    converter.prepare()
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        samples = fs.office_samples(tmp / "office")
        builders = {"docx": fs.docx_bytes, "xlsx": fs.xlsx_bytes, "pptx": fs.pptx_bytes}
        twin = {
            "doc": "docx",
            "rtf": "docx",
            "odt": "docx",
            "xls": "xlsx",
            "ods": "xlsx",
            "ppt": "pptx",
            "odp": "pptx",
        }
        for kind, path in samples.items():
            original = tmp / f"original_{kind}.{twin[kind]}"
            original.write_bytes(builders[twin[kind]](fs.PHRASES[kind]))
            truth = converter.convert(original).document
            t0 = time.perf_counter()
            ours = converter.convert(path).document
            seconds = time.perf_counter() - t0
            p, r, f = f1(tokens(ours.export_to_markdown()), tokens(truth.export_to_markdown()))
            rows.append((path.name, p, r, f, f"{len(ours.tables)}/{len(truth.tables)}", seconds))
        epub = tmp / "atlas.epub"
        epub.write_bytes(fs.epub_bytes())
        truth_text = (
            "Atlas of Nowhere Chapter one The sea was calm and the maps were blank. Chapter two She became "
            + fs.PHRASES["epub"]
        )
        t0 = time.perf_counter()
        doc = converter.convert(epub).document
        rows.append(
            (
                "atlas.epub",
                *f1(tokens(doc.export_to_markdown()), tokens(truth_text)),
                "-",
                time.perf_counter() - t0,
            )
        )
        eml = tmp / "invoice.eml"
        eml.write_bytes(fs.eml_bytes())
        t0 = time.perf_counter()
        doc = converter.convert(eml).document
        body = f"Invoice for the analytical engine Dear Charles, I write to say that {fs.PHRASES['eml']}. Kind regards, Ada"
        ours = Counter({k: v for k, v in tokens(doc.export_to_markdown()).items()})
        # The header block (From/To/Date/Attachments lines) is extra by design; recall is what matters here.
        rows.append(("invoice.eml", *f1(ours, tokens(body)), "-", time.perf_counter() - t0))
        msg = tmp / "audit.msg"
        msg.write_bytes(fs.msg_bytes())  # tests/msg_writer.py: Outlook's compound-file message layout
        t0 = time.perf_counter()
        doc = converter.convert(msg).document
        body = f"Bell tower audit Dear Alan, This spring {fs.PHRASES['msg']}. Regards, Grace"
        rows.append(
            ("audit.msg", *f1(tokens(doc.export_to_markdown()), tokens(body)), "-", time.perf_counter() - t0)
        )
    print(f"{'file':18} {'precision':>9} {'recall':>7} {'F1':>6} {'tables':>7} {'seconds':>8}")
    for name, p, r, f, tables, seconds in rows:
        print(f"{name:18} {p:9.3f} {r:7.3f} {f:6.3f} {tables:>7} {seconds:8.1f}")


if __name__ == "__main__":
    main()
