"""Conversion of every fixture file, and the clear per-file refusals for files that cannot be ingested."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from rag_worker.ingest.convert import Converter
from rag_worker.ingest.formats import IngestError
from rag_worker.ingest.limits import Limits
from tests.servers import SHARED, needs_shared

DOCLING = SHARED / "fixtures" / "docling" / "sources"
PYPDF = SHARED / "fixtures" / "py-pdf-sample-files"
ENCRYPTED = PYPDF / "005-libreoffice-writer-password" / "libreoffice-writer-password.pdf"
# Without ../shared, one placeholder keeps the parametrized test visible as skipped (needs_docling says why).
FIXTURES = sorted(DOCLING.iterdir()) + sorted(PYPDF.glob("*/*.pdf")) if DOCLING.is_dir() else [DOCLING]
needs_docling = needs_shared("fixtures/docling/sources")


@pytest.fixture(scope="module")
def converter() -> Converter:
    return Converter()


def plain_text(converted) -> str:
    return converted.document.export_to_markdown()


@needs_docling
@pytest.mark.parametrize("path", [p for p in FIXTURES if p != ENCRYPTED], ids=lambda p: p.name)
def test_every_fixture_converts_to_text(converter, path: Path):
    converted = converter.convert(path)
    assert len(plain_text(converted).split()) >= 3
    if path.suffix == ".pdf":
        assert converted.pages and converted.pages >= 1


@needs_docling
def test_pdf_text_keeps_page_numbers(converter):
    converted = converter.convert(DOCLING / "multi_page.pdf")
    pages = {p.page_no for item in converted.document.texts for p in item.prov}
    assert pages == {1, 2, 3, 4, 5}


@needs_docling
def test_encrypted_pdf_is_refused_with_a_reason(converter):
    with pytest.raises(IngestError) as err:
        converter.convert(ENCRYPTED)
    assert err.value.code == "encrypted"
    assert "password" in err.value.reason
    assert err.value.status == 400


def test_image_only_pdf_says_no_text_layer_when_ocr_is_off(tmp_path):
    from PIL import Image, ImageDraw

    from rag_worker.ingest.ocr import OcrOptions

    converter = Converter(ocr=OcrOptions(enabled=False))

    image = Image.new("RGB", (400, 200), "white")
    ImageDraw.Draw(image).text((20, 80), "SCANNED INVOICE 4711", fill="black")
    path = tmp_path / "scan.pdf"
    image.save(path, "PDF")
    with pytest.raises(IngestError) as err:
        converter.convert(path)
    assert err.value.code == "no_text_layer"
    assert "no text layer and OCR is off (OCR=off)" in err.value.reason


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("empty.pdf", b"", "empty"),
        ("empty.md", b"", "empty"),
        ("blank.txt", b"  \n\n \n", "empty"),
        pytest.param(
            "truncated.pdf",
            (DOCLING / "multi_page.pdf").read_bytes()[:3000] if DOCLING.is_dir() else b"",
            "corrupt",
            marks=needs_docling,
        ),
        ("image.pdf", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "unsupported_type"),
        ("notes.docx", b"just some text, not a zip", "unsupported_type"),
        ("binary.txt", b"MZ\x90\x00\x03\x00\x00\x00\x04\x00", "unsupported_type"),
        ("program.exe", b"MZ", "unsupported_type"),
    ],
)
def test_bad_files_are_refused_with_a_code(converter, tmp_path, name, data, code):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(IngestError) as err:
        converter.convert(path)
    assert err.value.code == code
    assert err.value.reason


def test_a_zip_that_is_not_a_docx_is_refused(converter, tmp_path):
    path = tmp_path / "fake.docx"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("hello.txt", "hello")
    with pytest.raises(IngestError) as err:
        converter.convert(path)
    assert err.value.code == "unsupported_type"


def _inflating_docx(path: Path, real: Path, filler_bytes: int, entries: int = 1) -> None:
    """A real docx plus `entries` highly compressible filler parts (what a zip bomb looks like)."""
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        for n in range(entries):
            dst.writestr(f"word/media/filler{n}.bin", b"\x00" * filler_bytes)


@needs_docling
def test_zip_bomb_is_refused_before_conversion(tmp_path):
    small = Converter(limits=Limits(max_unzipped_bytes=2 * 1024 * 1024))
    path = tmp_path / "bomb.docx"
    _inflating_docx(path, DOCLING / "lorem_ipsum.docx", filler_bytes=8 * 1024 * 1024)
    assert path.stat().st_size < 100_000  # a few KiB on disk...
    with pytest.raises(IngestError) as err:
        small.convert(path)
    assert err.value.code == "zip_bomb"  # ...refused by its inflated size
    assert err.value.status == 413


@needs_docling
def test_zip_with_too_many_parts_is_refused(tmp_path):
    small = Converter(limits=Limits(max_zip_entries=50))
    path = tmp_path / "many.docx"
    _inflating_docx(path, DOCLING / "lorem_ipsum.docx", filler_bytes=1, entries=60)
    with pytest.raises(IngestError) as err:
        small.convert(path)
    assert err.value.code == "zip_bomb"


def test_huge_spreadsheet_is_refused(tmp_path):
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    for r in range(200):
        ws.append([f"r{r}c{c}" for c in range(10)])
    path = tmp_path / "big.xlsx"
    wb.save(path)
    with pytest.raises(IngestError) as err:
        Converter(limits=Limits(max_spreadsheet_cells=1000)).convert(path)
    assert err.value.code == "too_many_cells"
    assert err.value.status == 413
    # the same file within the bound converts
    assert "r199c9" in plain_text(Converter(limits=Limits(max_spreadsheet_cells=5000)).convert(path))


def test_huge_csv_is_refused(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("\n".join(",".join(f"v{r}{c}" for c in range(10)) for r in range(200)))
    with pytest.raises(IngestError) as err:
        Converter(limits=Limits(max_spreadsheet_cells=1000)).convert(path)
    assert err.value.code == "too_many_cells"


def test_plain_text_is_not_read_as_markdown(converter, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes("# not a heading\n\nCafé prices *rose* by 5%.\n".encode("cp1252"))
    text = plain_text(converter.convert(path))
    assert "Café prices *rose* by 5%." in text.replace("\\*", "*")
    assert "not a heading" in text


@needs_docling
def test_display_name_decides_the_kind(converter, tmp_path):
    """The stored temp file has no meaningful name; the display name's extension picks the converter."""
    path = tmp_path / "upload.bin"
    path.write_bytes(io.BytesIO((DOCLING / "duck.md").read_bytes()).getvalue())
    converted = converter.convert(path, "Ünïcode duck notes.md")
    assert converted.kind == "md"
    assert converted.document.name == "Ünïcode duck notes"
