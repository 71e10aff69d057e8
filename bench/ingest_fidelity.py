"""Text-extraction fidelity: token F1 of our converted text against Docling's expected Markdown, per file.

    .venv/bin/python -m bench.ingest_fidelity

For each sample in shared/fixtures/docling/sources/ with an expected file in groundtruth_md/, the file goes
through our converter (PDFs through the native pipeline unless DOCLING_ARTIFACTS_PATH is set) and both texts are
reduced to lowercase word tokens; precision, recall and F1 are over token multisets (order ignored, Markdown
syntax ignored). The expected Markdown comes from Docling's full layout pipeline, so PDF rows show what the
model-free pipeline loses (headings, tables, reading order shows up only as lost or extra tokens).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter

from tests.servers import SHARED

TOKEN = re.compile(r"\w+", re.UNICODE)
DOCLING = SHARED / "fixtures" / "docling"


def tokens(text: str) -> Counter:
    return Counter(t.lower() for t in TOKEN.findall(text.replace("_", " ")))


def f1(ours: Counter, truth: Counter) -> tuple[float, float, float]:
    common = sum((ours & truth).values())
    p = common / max(1, sum(ours.values()))
    r = common / max(1, sum(truth.values()))
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def groundtruth(path) -> str | None:
    for name in (f"{path.name}.md", f"{path.stem}.md"):
        if (DOCLING / "groundtruth_md" / name).exists():
            return (DOCLING / "groundtruth_md" / name).read_text(encoding="utf-8")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.ingest.convert import Converter
    from rag_worker.ingest.formats import IngestError

    converter = Converter(artifacts_path=os.environ.get("DOCLING_ARTIFACTS_PATH") or None)
    converter.prepare()
    rows = []
    for path in sorted((DOCLING / "sources").iterdir()):
        truth = groundtruth(path)
        if truth is None:
            continue
        started = time.perf_counter()
        try:
            text = converter.convert(path).document.export_to_markdown()
        except IngestError as err:
            rows.append((path.name, None, None, None, 0.0, err.code))
            continue
        p, r, f = f1(tokens(text), tokens(truth))
        rows.append((path.name, p, r, f, time.perf_counter() - started, ""))

    print(f"PDF pipeline: {converter.pdf_pipeline}")
    print(f"{'file':40s} {'precision':>9s} {'recall':>7s} {'F1':>6s} {'seconds':>8s}")
    for name, p, r, f, secs, err in rows:
        if f is None:
            print(f"{name:40s} {'refused: ' + err:>33s}")
        else:
            print(f"{name:40s} {p:9.3f} {r:7.3f} {f:6.3f} {secs:8.2f}")
    scored = [r for r in rows if r[3] is not None]
    for label, group in (
        ("all", scored),
        ("pdf", [r for r in scored if r[0].endswith(".pdf")]),
        ("non-pdf", [r for r in scored if not r[0].endswith(".pdf")]),
    ):
        if group:
            print(f"mean F1 {label:8s} {sum(r[3] for r in group) / len(group):.3f} over {len(group)} files")


if __name__ == "__main__":
    main()
