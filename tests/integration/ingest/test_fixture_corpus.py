"""Every shared fixture document, bulk-indexed through `POST /index` on the real worker, is either retrievable
by a phrase that only it contains or refused with a clear reason.

The phrases come from text extracted independently of our converter (Docling's expected Markdown for its own
samples, pdfium's text layer for the py-pdf samples), so a file whose text our pipeline loses fails here.
"""

from __future__ import annotations

import re
import shutil

import httpx
import pytest

from tests.integration.ingest.helpers import StoreReader, sse_events, start_worker
from tests.servers import SHARED, needs_shared

DOCLING = SHARED / "fixtures" / "docling"
PYPDF = SHARED / "fixtures" / "py-pdf-sample-files"
pytestmark = [
    needs_shared("fixtures"),
    # Converting and embedding every shared fixture (the module's setup, counted in its first test): minutes on
    # two cores, more while the rest of the suite runs beside it (scripts/test.sh runs it in parallel).
    pytest.mark.timeout(1200),
]
REFUSED = {"libreoffice-writer-password.pdf": "encrypted"}
# Latin-script words: pdfium's text of the Arabic sample is mojibake around the one Latin word it holds.
WORD = re.compile(r"[A-Za-zÀ-ÖØ-öø-ÿ]{5,}")
WINDOW = 6


def reference_text(dataset: str, path) -> str:
    if dataset == "docling":
        for name in (f"{path.name}.md", f"{path.stem}.md"):
            truth = DOCLING / "groundtruth_md" / name
            if truth.exists():
                return truth.read_text(encoding="utf-8")
        raise AssertionError(f"no groundtruth for {path.name}")
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        return "\n".join(pdf[i].get_textpage().get_text_range() for i in range(min(len(pdf), 3)))
    finally:
        pdf.close()


def fixture_files() -> list[tuple[str, object]]:
    files = [("docling", p) for p in sorted((DOCLING / "sources").iterdir())]
    return files + [("pypdf", p) for p in sorted(PYPDF.glob("*/*.pdf"))]


def distinctive_phrase(words: list[str], others: list[set[str]]) -> tuple[str, int]:
    """The window of words with the most words no other file's reference contains, and how many other files
    hold every word of it (0 when it is distinctive; lorem-ipsum samples share all their words)."""
    seen_elsewhere = set().union(*others)
    best, best_score = words[:WINDOW], -1
    for start in range(0, max(1, len(words) - WINDOW + 1)):
        window = words[start : start + WINDOW]
        score = len({w.lower() for w in window} - seen_elsewhere)
        if score > best_score:
            best, best_score = window, score
    lowered = {w.lower() for w in best}
    return " ".join(best), sum(lowered <= other for other in others)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixture_corpus")
    root = tmp / "shared_uploads" / "fixtures"
    for dataset, path in fixture_files():
        (root / dataset).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / dataset / path.name)
    server = start_worker(tmp)
    try:
        with httpx.Client(base_url=server.url, timeout=900) as client:
            events = sse_events(client.post("/index", json={"index": "fixtures"}))
        yield events, StoreReader(tmp)
    finally:
        server.stop()


def test_the_batch_finishes_and_refuses_only_the_encrypted_pdf(indexed):
    events, _ = indexed
    assert events[-1][0] == "done", events[-3:]
    done = events[-1][1]
    assert {f["file"].split("/")[-1]: f["code"] for f in done["failed"]} == REFUSED
    refused = [d for e, d in events if e == "progress" and d["stage"] == "failed"]
    assert "password" in refused[0]["error"]
    assert done["documents"] == len(fixture_files()) - len(REFUSED)


def test_each_file_is_found_by_a_phrase_only_it_contains(indexed):
    _, reader = indexed
    refs = {
        (d, p.name): WORD.findall(reference_text(d, p)) for d, p in fixture_files() if p.name not in REFUSED
    }
    vocab = {key: {w.lower() for w in words} for key, words in refs.items()}
    missed = []
    for key, words in refs.items():
        phrase, sharing = distinctive_phrase(words, [v for k, v in vocab.items() if k != key])
        # a phrase other files also hold entirely may rank them first: the file must be among them
        found = reader.files_for(phrase, "fixtures", mode="fts", limit=3 + sharing)
        if key[1] not in found:
            missed.append(f"{key[0]}/{key[1]}: {phrase!r} -> {found}")
    assert not missed, "\n".join(missed)
