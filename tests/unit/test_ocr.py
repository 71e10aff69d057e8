"""OCR of scans and photos of text with the real Tesseract: images rendered here with Pillow, wrapped in PDFs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_worker.ingest.convert import Converter
from rag_worker.ingest.formats import IngestError
from rag_worker.ingest.ocr import OcrOptions, status, tesseract
from tests.servers import SHARED

needs_tesseract = pytest.mark.skipif(
    tesseract() is None, reason="tesseract is not installed (scripts/setup.sh --dev installs it)"
)
TEXT_PDF = SHARED / "fixtures" / "docling" / "sources" / "multi_page.pdf"
SCAN_PHRASE = "the heron audits seventeen lanterns"
PHOTO_PHRASE = "violet gravel covers the quiet orchard"


def text_image(text: str, *, rotate: float = 0.0):
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (2000, 400), "white")
    font = ImageFont.load_default(size=64)
    ImageDraw.Draw(image).text((60, 150), text, fill="black", font=font)
    return image.rotate(rotate, fillcolor="white") if rotate else image


def scan_pdf(path: Path, text: str) -> Path:
    text_image(text).save(path, "PDF", resolution=200)
    return path


def words(converted) -> str:
    return " ".join(converted.document.export_to_markdown().lower().split())


@needs_tesseract
def test_a_scanned_pdf_is_read_by_ocr_with_its_page_number(tmp_path):
    converted = Converter().convert(scan_pdf(tmp_path / "scan.pdf", SCAN_PHRASE.capitalize() + "."))
    assert SCAN_PHRASE in words(converted)
    assert {p.page_no for t in converted.document.texts for p in t.prov} == {1}
    assert converted.metadata["ocr_pages"] == [1]


@needs_tesseract
@pytest.mark.parametrize("suffix", [".png", ".jpg", ".tiff", ".webp"])
def test_a_photo_of_text_is_read(tmp_path, suffix):
    path = tmp_path / f"photo{suffix}"
    text_image(PHOTO_PHRASE.capitalize() + ".", rotate=1.5).save(path)
    assert PHOTO_PHRASE in words(Converter().convert(path))


@needs_tesseract
@pytest.mark.skipif(not TEXT_PDF.exists(), reason="needs ../shared (fixtures/docling)")
def test_a_mixed_pdf_reads_only_its_scanned_page(tmp_path):
    import pypdfium2 as pdfium

    scan = scan_pdf(tmp_path / "scan.pdf", SCAN_PHRASE.capitalize() + ".")
    mixed = pdfium.PdfDocument(str(TEXT_PDF))
    pages = len(mixed)
    mixed.import_pages(pdfium.PdfDocument(str(scan)))
    path = tmp_path / "mixed.pdf"
    mixed.save(str(path))
    converted = Converter().convert(path)
    assert converted.metadata["ocr_pages"] == [pages + 1]
    by_page = {}
    for item in converted.document.texts:
        for prov in item.prov:
            by_page.setdefault(prov.page_no, []).append(item.text.lower())
    assert set(by_page) == set(range(1, pages + 2))
    assert SCAN_PHRASE in " ".join(" ".join(by_page[pages + 1]).split())


def test_ocr_off_refuses_images_and_scans_saying_so(tmp_path):
    converter = Converter(ocr=OcrOptions(enabled=False))
    path = tmp_path / "photo.png"
    text_image("anything").save(path)
    with pytest.raises(IngestError) as err:
        converter.convert(path)
    assert err.value.code == "no_text_layer" and "OCR=off" in err.value.reason


def test_without_tesseract_a_scan_is_refused_with_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no tesseract on this PATH
    assert status(OcrOptions())["available"] is False
    with pytest.raises(IngestError) as err:
        Converter().convert(scan_pdf(tmp_path / "scan.pdf", "Some scanned words."))
    assert err.value.code == "no_text_layer" and "tesseract-ocr" in err.value.reason


@needs_tesseract
def test_a_missing_language_pack_is_reported():
    state = status(OcrOptions(languages="eng+xyz"))
    assert state["available"] is False and "xyz" in state["reason"]


@needs_tesseract
def test_ocr_stops_at_its_time_limit(tmp_path):
    converter = Converter(ocr=OcrOptions(timeout_s=0.001))
    with pytest.raises(IngestError) as err:
        converter.convert(scan_pdf(tmp_path / "scan.pdf", SCAN_PHRASE))
    assert err.value.code == "timeout" and "OCR_TIMEOUT_S" in err.value.reason


def test_a_file_named_like_an_image_that_is_not_one_is_refused(tmp_path):
    path = tmp_path / "fake.png"
    path.write_bytes(b"GIF89a not a png")
    with pytest.raises(IngestError) as err:
        Converter().convert(path)
    assert err.value.code == "unsupported_type"


FRENCH_LINES = ["Les salariés ont droit à vingt-cinq jours", "de congés payés par an, reportés en été."]
DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


@needs_tesseract
@pytest.mark.skipif(not DEJAVU.exists(), reason="fonts-dejavu-core is not installed")
def test_a_french_scan_is_read_again_with_the_french_pack(tmp_path):
    import time

    from PIL import Image, ImageDraw, ImageFont

    from rag_worker.ingest.ocr import PackChooser, _languages

    if "fra" not in _languages(tesseract()):
        pytest.skip("tesseract-ocr-fra is not installed (OCR_LANGUAGES=eng+fra scripts/setup.sh --dev)")
    image = Image.new("L", (2200, 400), "white")
    font = ImageFont.truetype(str(DEJAVU), 64)
    for row, line in enumerate(FRENCH_LINES):
        ImageDraw.Draw(image).text((60, 80 + row * 120), line, fill="black", font=font)
    png = tmp_path / "scan.png"
    image.save(png)

    chooser = PackChooser(OcrOptions(languages="eng+fra"))
    text = " ".join(chooser.read(png, time.monotonic() + 120).split())
    assert chooser.current == "fra" and chooser.rereads == 1, "read with eng, detected French, read again"
    for word in ("salariés", "congés", "payés", "été"):
        assert word in text, text
    # One configured pack: read once with it, nothing detected.
    alone = PackChooser(OcrOptions(languages="fra"))
    assert "congés" in alone.read(png, time.monotonic() + 120) and alone.rereads == 0
