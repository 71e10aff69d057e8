"""Hostile files made on the spot (no big fixtures): a PDF of many pages in a few bytes, a lying spreadsheet."""

from __future__ import annotations

import io
import re
import zipfile


def many_page_pdf(pages: int, sentence: str = "The harbour fees are listed on this page.") -> bytes:
    """A valid PDF whose pages all share one font and one content stream: ~100 bytes a page."""
    content = b"BT /F1 12 Tf 72 720 Td (" + sentence.encode("latin-1") + b") Tj ET"
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages)).encode()
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        *([page] * pages),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def xlsx_declaring(rows: int, cols: int, declared: str) -> bytes:
    """A workbook holding rows x cols cells whose sheet declares the dimension `declared` (e.g. "A1:A1")."""
    import openpyxl

    wb = openpyxl.Workbook()
    for r in range(rows):
        wb.active.append([f"r{r}c{c}" for c in range(cols)])
    raw = io.BytesIO()
    wb.save(raw)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(raw.getvalue())) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            data = src.read(info)
            if info.filename.startswith("xl/worksheets/sheet"):
                data, n = re.subn(
                    rb'<dimension ref="[^"]*"', b'<dimension ref="' + declared.encode() + b'"', data
                )
                assert n == 1, "openpyxl wrote no dimension to lie about"
            dst.writestr(info, data)
    return out.getvalue()
