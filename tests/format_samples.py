"""Sample files of the mail, legacy office and e-book formats, made on the spot (nothing downloaded).

Each sample holds a phrase no other sample holds (`PHRASES`), so a test can search for it and expect exactly that
file. Office Open XML originals are written with python-docx / openpyxl / python-pptx; the legacy and
OpenDocument twins are converted from them by LibreOffice headless (the same converter the worker uses the other
way round), so they are real files written by a real office suite. E-mails are built with the standard library,
Outlook messages with tests/msg_writer.py (the compound file and MS-OXMSG layout Outlook writes), the EPUB as the
zip of XHTML chapters the format is.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
import zipfile
from email.message import EmailMessage
from pathlib import Path

PHRASES = {
    "doc": "the marmalade turbine hums in the attic",
    "rtf": "a periwinkle lighthouse guards the harbour",
    "odt": "eleven tangerine zeppelins drifted over Utrecht",
    "xls": "quince inventory ledger",
    "ods": "saffron warehouse tally",
    "ppt": "the obsidian walrus presentation",
    "odp": "cobalt penguin roadmap",
    "epub": "the cartographer of velvet islands",
    "eml": "the plum coloured invoice arrived on Tuesday",
    "eml_html": "an aubergine newsletter in hypertext",
    "attachment": "the gooseberry clause of the attached contract",
    "msg": "the walnut auditors counted forty brass bells",
    "msg_attachment": "the cedar appendix names every bell ringer",
}
TABLE = [["Region", "Units", "Revenue"], ["North", 120, 3400.5], ["South", 80, 2100.25]]


def soffice() -> str | None:
    return shutil.which("soffice") or shutil.which("libreoffice")


def docx_bytes(phrase: str) -> bytes:
    import docx

    d = docx.Document()
    d.add_heading("Quarterly operations note", level=1)
    d.add_paragraph(f"This note records that {phrase}.")
    d.add_paragraph("Operations stayed within budget during the quarter and staffing was stable.")
    t = d.add_table(rows=len(TABLE), cols=3)
    for i, row in enumerate(TABLE):
        for j, value in enumerate(row):
            t.cell(i, j).text = str(value)
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def xlsx_bytes(phrase: str) -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    ws = book.active
    ws.title = "Sales"
    for row in TABLE:
        ws.append(row)
    ws.append([phrase, None, None])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def pptx_bytes(phrase: str) -> bytes:
    from pptx import Presentation

    prs = Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = "Quarterly review"
    slide.placeholders[1].text = f"In this deck: {phrase}."
    second = prs.slides.add_slide(prs.slide_layouts[1])
    second.shapes.title.text = "Next steps"
    second.placeholders[1].text = "Hire two engineers and open the new office."
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def office_samples(folder: Path) -> dict[str, Path]:
    """doc, rtf, odt, xls, ods, ppt, odp files in `folder` (needs LibreOffice); kind -> path."""
    binary = soffice()
    if binary is None:
        raise RuntimeError("LibreOffice (soffice) is not installed")
    plan = {
        "doc": ("docx", docx_bytes, "doc:MS Word 97"),
        "rtf": ("docx", docx_bytes, "rtf"),
        "odt": ("docx", docx_bytes, "odt"),
        "xls": ("xlsx", xlsx_bytes, "xls:MS Excel 97"),
        "ods": ("xlsx", xlsx_bytes, "ods"),
        "ppt": ("pptx", pptx_bytes, "ppt:MS PowerPoint 97"),
        "odp": ("pptx", pptx_bytes, "odp"),
    }
    out: dict[str, Path] = {}
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for kind, (source_kind, build, target) in plan.items():
            source = tmp / f"{kind}_sample.{source_kind}"
            source.write_bytes(build(PHRASES[kind]))
            subprocess.run(
                [
                    binary,
                    f"-env:UserInstallation={(tmp / 'profile').as_uri()}",
                    "--headless",
                    "--norestore",
                    "--convert-to",
                    target,
                    "--outdir",
                    str(tmp),
                    str(source),
                ],
                check=True,
                capture_output=True,
                timeout=180,
            )
            made = tmp / f"{kind}_sample.{kind}"
            out[kind] = folder / made.name
            shutil.move(made, out[kind])
    return out


def eml_bytes() -> bytes:
    msg = EmailMessage()
    msg["From"] = "Ada Lovelace <ada@example.org>"
    msg["To"] = "Charles Babbage <charles@example.org>"
    msg["Subject"] = "Invoice for the analytical engine"
    msg["Date"] = "Tue, 03 Sep 2024 10:15:00 +0000"
    msg.set_content(f"Dear Charles,\n\nI write to say that {PHRASES['eml']}.\n\nKind regards,\nAda")
    msg.add_alternative(f"<p>Dear Charles,</p><p>I write to say that {PHRASES['eml']}.</p>", subtype="html")
    msg.add_attachment(
        f"Contract terms.\n\nSection 4 is {PHRASES['attachment']}.".encode(),
        maintype="text",
        subtype="plain",
        filename="contract.txt",
    )
    msg.add_attachment(
        b"\x7fELF not indexed", maintype="application", subtype="octet-stream", filename="tool.bin"
    )
    return msg.as_bytes()


def eml_html_only_bytes() -> bytes:
    msg = EmailMessage()
    msg["From"] = "news@example.org"
    msg["To"] = "reader@example.org"
    msg["Subject"] = "Monthly newsletter"
    msg.set_content(
        f"<html><body><h1>News</h1><p>This month: {PHRASES['eml_html']}.</p><script>alert(1)</script></body></html>",
        subtype="html",
    )
    return msg.as_bytes()


def epub_bytes() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        zf.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
            '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        zf.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
            '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Atlas of Nowhere</dc:title></metadata>'
            '<manifest><item id="c1" href="ch1.xhtml" media-type="application/xhtml+xml"/>'
            '<item id="c2" href="ch2.xhtml" media-type="application/xhtml+xml"/></manifest>'
            '<spine><itemref idref="c1"/><itemref idref="c2"/></spine></package>',
        )
        zf.writestr(
            "OEBPS/ch1.xhtml",
            "<html xmlns='http://www.w3.org/1999/xhtml'><body><h2>Chapter one</h2>"
            "<p>The sea was calm and the maps were blank.</p></body></html>",
        )
        zf.writestr(
            "OEBPS/ch2.xhtml",
            "<html xmlns='http://www.w3.org/1999/xhtml'><body><h2>Chapter two</h2>"
            f"<p>She became {PHRASES['epub']}.</p></body></html>",
        )
    return out.getvalue()


MSG_TABLE = "ward,cost\r\nNorth,1200.50\r\nSouth,980.00\r\n"


def msg_bytes() -> bytes:
    """An Outlook message with a text attachment (a document of its own) and a CSV one (also an SQL table)."""
    from datetime import UTC, datetime

    from tests.msg_writer import Recipient
    from tests.msg_writer import msg_bytes as write_msg

    return write_msg(
        sender=("Grace Hopper", "grace@example.org"),
        to=[Recipient("Alan Turing", "alan@example.org")],
        subject="Bell tower audit",
        body=f"Dear Alan,\r\n\r\nThis spring {PHRASES['msg']}.\r\n\r\nRegards,\r\nGrace",
        sent=datetime(2024, 5, 6, 9, 30, tzinfo=UTC),
        attachments=[
            ("appendix.txt", f"Appendix.\n\nIn short, {PHRASES['msg_attachment']}.".encode()),
            ("ward costs.csv", MSG_TABLE.encode()),
        ],
    )


def cjk_pdf_bytes(
    lines: list[str], font: str = "HYSMyeongJo-Medium", registry=("Adobe", "Korea1", 2)
) -> bytes:
    """A one-page PDF whose text layer holds `lines` in any script, as Korean, Chinese or Japanese office software
    writes them: a Type0 font (Identity-H, 2-byte codes) not embedded, named as one of the standard CJK fonts
    (HYSMyeongJo-Medium is Adobe-Korea1's), and a ToUnicode map from each code to its character, which is what
    text extraction reads. No font file is needed to make or to read it (none with Hangul is installed here);
    a viewer without the font shows a substitute."""
    chars = sorted({c for line in lines for c in line})
    cid = {c: i + 1 for i, c in enumerate(chars)}
    ops = ["BT", "/F1 14 Tf", "18 TL", "72 760 Td"]
    for line in lines:
        ops.append("<" + "".join(f"{cid[c]:04X}" for c in line) + "> Tj T*")
    ops.append("ET")
    content = "\n".join(ops).encode()
    bf = []
    for i in range(0, len(chars), 100):
        block = chars[i : i + 100]
        bf.append(f"{len(block)} beginbfchar")
        bf += [f"<{cid[c]:04X}> <{ord(c):04X}>" for c in block]
        bf.append("endbfchar")
    cmap = "\n".join(
        [
            "/CIDInit /ProcSet findresource begin",
            "12 dict begin",
            "begincmap",
            "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def",
            "/CMapName /Adobe-Identity-UCS def",
            "/CMapType 2 def",
            "1 begincodespacerange",
            "<0000> <FFFF>",
            "endcodespacerange",
            *bf,
            "endcmap",
            "CMapName currentdict /CMap defineresource pop",
            "end",
            "end",
        ]
    ).encode()
    reg, order, sup = registry
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        f"<< /Type /Font /Subtype /Type0 /BaseFont /{font} /Encoding /Identity-H /DescendantFonts [6 0 R] /ToUnicode 8 0 R >>".encode(),
        f"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /{font} /CIDSystemInfo << /Registry ({reg}) /Ordering ({order}) /Supplement {sup} >> /FontDescriptor 7 0 R /DW 1000 /CIDToGIDMap /Identity >>".encode(),
        f"<< /Type /FontDescriptor /FontName /{font} /Flags 6 /FontBBox [0 -141 1000 859] /ItalicAngle 0 /Ascent 859 /Descent -141 /CapHeight 700 /StemV 80 >>".encode(),
        b"<< /Length %d >>\nstream\n" % len(cmap) + cmap + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for n, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)
