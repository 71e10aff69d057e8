"""Where each chunk came from: PDF boxes that hold the passage's words, sheet rows, slides, heading paths; and
indexes written before locations existed still read (no location) and take new rows with one."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.answer import Document
from rag_worker.ingest.chunk import Chunker
from rag_worker.ingest.convert import Converter
from rag_worker.ingest.ocr import parse_tsv, tesseract
from rag_worker.pipeline.expand import to_document
from rag_worker.store import Store
from tests.servers import SHARED, needs_shared

DOCLING = SHARED / "fixtures" / "docling" / "sources"


@pytest.fixture(scope="module")
def chunker():
    from transformers import AutoTokenizer

    from rag_worker.settings import packaged_embedding_model

    tokenizer = AutoTokenizer.from_pretrained(packaged_embedding_model(), local_files_only=True)
    return Chunker(tokenizer, max_tokens=128)


@pytest.fixture(scope="module")
def converter():
    return Converter()


def text_in_box(pdf_path: Path, page: int, box: list[float]) -> str:
    """What pdfium reads inside a location box (fractions, origin top left) of a page."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(pdf_path))
    try:
        p = pdf[page - 1]
        width, height = p.get_size()
        x0, y0, x1, y1 = box
        text = p.get_textpage().get_text_bounded(
            left=x0 * width - 1, bottom=(1 - y1) * height - 1, right=x1 * width + 1, top=(1 - y0) * height + 1
        )
        return " ".join(text.split())
    finally:
        pdf.close()


@needs_shared("fixtures/docling/sources")
def test_pdf_chunks_carry_boxes_that_hold_their_words(chunker, converter):
    path = DOCLING / "multi_page.pdf"
    chunks = chunker.chunk(converter.convert(path).document)
    on_three = [c for c in chunks if c.page == 3]
    assert on_three
    for chunk in on_three:
        location = chunk.metadata["location"]
        assert location["pages"][0] == 3 and location["label"].startswith("p")
        boxes = location["boxes"]
        assert boxes and all(0 <= v <= 1 for b in boxes for v in b[1:]) and boxes[0][0] == 3
        # the first box is the passage's first line: its words are the chunk's first words
        first_words = " ".join([w for w in chunk.text.split() if any(ch.isalnum() for ch in w)][:4])
        assert first_words in text_in_box(path, 3, boxes[0][1:]), (first_words, boxes[0])


def test_spreadsheet_chunks_cite_sheet_and_rows(tmp_path, chunker, converter):
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Wards"
    sheet.append(["ward", "beds", "nurse"])
    for i in range(60):
        sheet.append([f"ward{i}", i * 3, f"nurse name {i}"])
    path = tmp_path / "wards.xlsx"
    book.save(path)
    chunks = chunker.chunk(converter.convert(path).document)
    assert len(chunks) > 2
    seen = 1
    for chunk in chunks:
        location = chunk.metadata["location"]
        first, last = location["rows"]
        assert location["sheet"] == "Wards"
        assert location["label"] == f"Sheet 'Wards', rows {first}–{last}"
        data_lines = [ln for ln in chunk.text.splitlines() if ln.startswith("|")][2:]
        # the sheet's row `first` (or the one after the header) is the chunk's first data row
        top = first + 1 if first == 1 else first
        assert f"ward{top - 2} " in data_lines[0] + " ", (location, data_lines[0])
        assert f"ward{last - 2} " in data_lines[-1] + " "
        assert first == seen or first == seen + 1
        seen = last
    assert seen == 61  # every row cited once, to the last


@needs_shared("fixtures/docling/sources")
def test_slides_and_heading_paths(chunker, converter):
    slides = chunker.chunk(converter.convert(DOCLING / "powerpoint_sample.pptx").document)
    assert {c.metadata["location"]["slide"] for c in slides} >= {1, 2}
    assert all(c.metadata["location"]["label"].startswith("Slide") for c in slides)
    docx = chunker.chunk(converter.convert(DOCLING / "unit_test_headers.docx").document)
    deep = [c for c in docx if c.headings[-1:] == ["Section 1.1"]][0]
    assert deep.metadata["location"]["headings"] == deep.headings
    assert deep.metadata["location"]["label"] == " › ".join(deep.headings)


def test_tesseract_tsv_becomes_paragraphs_with_line_boxes():
    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"
    rows = [
        "1\t1\t0\t0\t0\t0\t0\t0\t1000\t800\t-1\t",
        "5\t1\t1\t1\t1\t1\t10\t20\t50\t10\t96\tthe",
        "5\t1\t1\t1\t1\t2\t70\t18\t60\t14\t96\theron",
        "5\t1\t1\t1\t2\t1\t10\t40\t40\t10\t96\taudits",
        "5\t1\t2\t1\t1\t1\t10\t400\t40\t10\t96\tlanterns",
        "5\t1\t2\t1\t1\t2\t60\t400\t40\t10\t-1\t ",
        "garbage line",
    ]
    page = parse_tsv("text", "\n".join([header, *rows]))
    assert (page.width, page.height) == (1000, 800)
    assert [p.text for p in page.paragraphs] == ["the heron audits", "lanterns"]
    assert page.paragraphs[0].lines == [(10, 18, 130, 32), (10, 40, 50, 50)]


@pytest.mark.skipif(
    tesseract() is None, reason="tesseract is not installed (scripts/setup.sh --dev installs it)"
)
def test_a_scanned_page_is_located_by_its_ocr_boxes(tmp_path, chunker, converter):
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (1700, 2200), "white")
    ImageDraw.Draw(image).text(
        (200, 1500), "the heron audits seventeen lanterns", fill="black", font=ImageFont.load_default(size=64)
    )
    path = tmp_path / "scan.pdf"
    image.save(path, "PDF", resolution=200)
    chunks = chunker.chunk(converter.convert(path).document)
    location = chunks[0].metadata["location"]
    assert location["ocr"] is True and location["pages"] == [1]
    page, x0, y0, x1, y1 = location["boxes"][0]
    # the words were drawn at (200, 1500) px of a 1700 x 2200 px page, 64 px high
    assert (
        page == 1 and x0 == pytest.approx(200 / 1700, abs=0.02) and y0 == pytest.approx(1500 / 2200, abs=0.02)
    )
    assert x1 > 0.5 and y1 - y0 < 0.05


def old_rows(filename: str, texts: list[str]) -> list[dict]:
    """Rows as today's (pre-location) ingestion wrote them."""
    return [
        {
            "document_id": "d" * 64,
            "filename": filename,
            "dataset": "default",
            "page": 2,
            "chunk_index": i,
            "text": text,
            "metadata": {"headings": [], "content_types": ["text"], "kind": "pdf", "title": "old"},
        }
        for i, text in enumerate(texts)
    ]


def test_an_index_written_before_locations_reads_and_takes_new_rows(tmp_path, embedder):
    store = Store(tmp_path / "lancedb", embedder)
    store.replace_document(
        "old",
        dataset="default",
        filename="old.pdf",
        rows=old_rows("old.pdf", ["Lanterns are audited yearly."]),
    )
    hit = store.search("old", "lanterns audited", mode="fts", limit=1)[0]
    document = Document.model_validate(to_document(hit, 1, "S1"))
    assert document.location is None and document.page == 2  # cited as before: "p. 2"
    # a file uploaded to the old index now gets its location, in the same table
    rows = old_rows("new.pdf", ["Herons count seventeen lanterns."])
    rows[0]["metadata"]["location"] = {"pages": [2], "label": "p. 2", "boxes": [[2, 0.1, 0.2, 0.8, 0.25]]}
    store.replace_document("old", dataset="default", filename="new.pdf", rows=rows)
    chunks = store.document_chunks("old", "default", "new.pdf")
    assert chunks[0].metadata["location"]["boxes"] == [[2, 0.1, 0.2, 0.8, 0.25]]
    hit = store.search("old", "herons seventeen", mode="fts", limit=1)[0]
    assert Document.model_validate(to_document(hit, 1, "S1")).location.label == "p. 2"
    assert [h.text for h in store.document_chunks("old", "default", "old.pdf")] == [
        "Lanterns are audited yearly."
    ]
