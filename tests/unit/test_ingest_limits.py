"""Issue 11's file limits: pages of a PDF, cells a spreadsheet really holds, and conversion in a child process
with a memory and a time limit (the worker's converter, `IsolatedConverter`)."""

from __future__ import annotations

import pytest

from rag_worker.ingest.convert import Converter
from rag_worker.ingest.formats import IngestError
from rag_worker.ingest.isolated import IsolatedConverter
from rag_worker.ingest.limits import Limits
from tests.hostile import many_page_pdf, xlsx_declaring
from tests.servers import SHARED

DOCLING = SHARED / "fixtures" / "docling" / "sources"
ENCRYPTED = (
    SHARED / "fixtures/py-pdf-sample-files/005-libreoffice-writer-password/libreoffice-writer-password.pdf"
)


def test_a_pdf_over_max_pdf_pages_is_refused_before_conversion(tmp_path):
    path = tmp_path / "long.pdf"
    path.write_bytes(many_page_pdf(4))
    with pytest.raises(IngestError) as err:
        Converter(limits=Limits(max_pdf_pages=3)).convert(path)
    assert (err.value.code, err.value.status) == ("too_many_pages", 413)
    assert "4 pages" in err.value.message and "MAX_PDF_PAGES" in err.value.message
    assert Converter(limits=Limits(max_pdf_pages=4)).convert(path).pages == 4


def test_an_image_over_max_image_pixels_is_refused_from_its_header_with_the_limit(tmp_path):
    from tests.integration.hardening.test_worker_uploads import png_declaring

    path = tmp_path / "wide.png"
    path.write_bytes(png_declaring(3000, 2000))
    with pytest.raises(IngestError) as err:
        Converter(limits=Limits(max_image_pixels=5_000_000)).convert(path)
    assert (err.value.code, err.value.status) == ("image_too_large", 413)
    assert "3,000 x 2,000" in err.value.message and "5,000,000" in err.value.message
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_declaring(40000, 40000))  # past twice Pillow's own bound: it refuses before the size
    with pytest.raises(IngestError) as err:
        Converter().convert(bomb)
    assert err.value.code == "image_too_large" and "MAX_IMAGE_PIXELS" in err.value.message


def test_the_default_page_limit_is_2000():
    assert Limits().max_pdf_pages == 2000


def test_a_sheet_that_declares_one_cell_but_holds_6000_is_refused(tmp_path):
    path = tmp_path / "liar.xlsx"
    path.write_bytes(xlsx_declaring(600, 10, "A1:A1"))
    with pytest.raises(IngestError) as err:
        Converter(limits=Limits(max_spreadsheet_cells=5000)).convert(path)
    assert (err.value.code, err.value.status) == ("too_many_cells", 413)
    assert "MAX_SPREADSHEET_CELLS" in err.value.message


def test_a_sheet_that_declares_a_huge_range_but_holds_little_is_converted(tmp_path):
    path = tmp_path / "modest.xlsx"
    path.write_bytes(xlsx_declaring(20, 5, "A1:XFD1048576"))
    converted = Converter(limits=Limits(max_spreadsheet_cells=5000)).convert(path)
    assert "r19c4" in converted.document.export_to_markdown()


# -- the same conversions in a child process --------------------------------------------------------------------


@pytest.fixture(scope="module")
def isolated():
    converter = IsolatedConverter(limits=Limits(max_pdf_pages=50, max_spreadsheet_cells=5000), memory_mb=256)
    converter.prepare()
    yield converter
    converter.close()


def test_the_child_converts_what_the_worker_did(isolated):
    for name in ("multi_page.pdf", "lorem_ipsum.docx", "wiki_duck.html", "xlsx_01.xlsx"):
        here = Converter().convert(DOCLING / name)
        there = isolated.convert(DOCLING / name)
        assert there.kind == here.kind and there.pages == here.pages, name
        assert there.document.export_to_markdown() == here.document.export_to_markdown(), name


def test_the_child_refuses_with_the_same_codes(isolated, tmp_path):
    with pytest.raises(IngestError) as err:
        isolated.convert(ENCRYPTED)
    assert (err.value.code, err.value.status, err.value.field) == ("encrypted", 400, "file")
    long = tmp_path / "long.pdf"
    long.write_bytes(many_page_pdf(51))
    with pytest.raises(IngestError) as err:
        isolated.convert(long)
    assert (err.value.code, err.value.status) == ("too_many_pages", 413)
    liar = tmp_path / "liar.xlsx"
    liar.write_bytes(xlsx_declaring(600, 10, "A1:A1"))
    with pytest.raises(IngestError) as err:
        isolated.convert(liar)
    assert err.value.code == "too_many_cells"


def test_a_conversion_past_its_memory_limit_is_a_422_naming_the_setting(tmp_path):
    converter = IsolatedConverter(limits=Limits(max_pdf_pages=5000), memory_mb=48)
    try:
        small = converter.convert(DOCLING / "multi_page.pdf")
        assert small.pages == 5, "an ordinary file converts within the same limit"
        path = tmp_path / "heavy.pdf"
        path.write_bytes(many_page_pdf(1500))
        with pytest.raises(IngestError) as err:
            converter.convert(path)
        assert (err.value.code, err.value.status) == ("convert_memory", 422)
        assert "CONVERT_MAX_MEMORY_MB" in err.value.message and "48 MB" in err.value.message
    finally:
        converter.close()
