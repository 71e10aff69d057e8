"""Issue 27 against the real worker's upload and read routes: a linked image in an ODT/ODP fetched during
conversion (SSRF), a foreign `Host` (DNS rebinding), e-mails with a large header block or many attachments,
documents of too many chunks, bidi controls in file names, long attachment names, an oversized image."""

from __future__ import annotations

import io
import struct
import zlib
from datetime import UTC, datetime
from email.message import EmailMessage

import httpx
import pytest

from tests.format_samples import soffice
from tests.integration.hardening.helpers import Listener
from tests.integration.ingest.helpers import documents, upload
from tests.msg_writer import Recipient, msg_bytes
from tests.servers import worker_process

MAX_CHUNKS = 5
MAX_ATTACHMENTS = 3
EVIL_HOST = "evil.example"


@pytest.fixture(scope="module")
def worker(tmp_path_factory, fake_ollama_server):
    from tests.ollama_server import OLLAMA_ENV

    env = {
        "OLLAMA_HOST": fake_ollama_server.url,
        "OVERVIEW_SUMMARIES": "off",
        "MAX_CHUNKS_PER_DOCUMENT": str(MAX_CHUNKS),
        "MAX_ATTACHMENTS_PER_MESSAGE": str(MAX_ATTACHMENTS),
        **OLLAMA_ENV,
    }
    with worker_process(tmp_path_factory.mktemp("worker_uploads"), env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(worker):
    with httpx.Client(base_url=worker.url, timeout=300) as c:
        yield c


def clear_refusal(resp: httpx.Response) -> dict:
    """A 4xx with a JSON body that names what is wrong (not an internal error)."""
    assert 400 <= resp.status_code < 500, f"{resp.status_code}: {resp.text[:300]}"
    body = resp.json()
    assert body.get("code") not in (None, "internal") and body.get("error"), body
    return body


def indexed_or_clearly_refused(resp: httpx.Response) -> None:
    if resp.status_code == 200:
        assert resp.json().get("chunks", 1) >= 1, resp.text[:300]
        return
    clear_refusal(resp)


# -- SSRF through LibreOffice -----------------------------------------------------------------------------------


def odt_linking(url: str) -> bytes:
    from odf.draw import Frame, Image
    from odf.opendocument import OpenDocumentText
    from odf.text import P

    doc = OpenDocumentText()
    para = P(text="The lighthouse keeper logs every passing ship.")
    frame = Frame(width="4cm", height="4cm", anchortype="paragraph", name="linked")
    frame.addElement(Image(href=url, type="simple", show="embed", actuate="onLoad"))
    para.addElement(frame)
    doc.text.addElement(para)
    out = io.BytesIO()
    doc.write(out)
    return out.getvalue()


def odp_linking(url: str) -> bytes:
    from odf.draw import Frame, Image, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
    from odf.style import MasterPage, PageLayout
    from odf.text import P

    doc = OpenDocumentPresentation()
    layout = PageLayout(name="layout")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="plain", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    page = Page(masterpagename=master, name="one")
    doc.presentation.addElement(page)
    text = Frame(width="20cm", height="3cm", x="1cm", y="1cm")
    box = TextBox()
    box.addElement(P(text="The lighthouse keeper logs every passing ship."))
    text.addElement(box)
    page.addElement(text)
    picture = Frame(width="4cm", height="4cm", x="1cm", y="5cm")
    picture.addElement(Image(href=url, type="simple", show="embed", actuate="onLoad"))
    page.addElement(picture)
    out = io.BytesIO()
    doc.write(out)
    return out.getvalue()


@pytest.mark.skipif(soffice() is None, reason="LibreOffice (soffice) is not installed")
@pytest.mark.parametrize(("name", "build"), [("linked.odt", odt_linking), ("linked.odp", odp_linking)])
def test_a_linked_image_in_an_open_document_is_not_fetched(client, name, build):
    with Listener() as internal:
        data = build(internal.url + "/latest/meta-data/iam/credentials.png")
        resp = upload(client, name, data, index="ssrf")
        assert internal.hits == [], f"uploading {name} made the worker fetch {internal.hits}"
    assert resp.status_code in (200, 400, 413, 415, 422), resp.text[:300]


# -- DNS rebinding ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/config", "/get_documents?index=rebind"])
def test_a_request_for_a_foreign_host_is_refused(client, path):
    """A page on evil.example whose name now resolves to 127.0.0.1 sends `Host: evil.example` and no Origin."""
    resp = upload(client, "payroll.txt", b"The payroll runs on the last Friday of the month.", index="rebind")
    assert resp.status_code == 200, resp.text
    resp = client.get(path, headers={"Host": EVIL_HOST})
    clear_refusal(resp)
    # Loopback names still answer.
    assert client.get(path, headers={"Host": f"localhost:{client.base_url.port}"}).status_code == 200


# -- e-mails ----------------------------------------------------------------------------------------------------


def eml(recipients: int = 1, attachments: int = 0) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Ada Lovelace <ada@example.org>"
    msg["To"] = ", ".join(f"Person {i} <person{i}@example.org>" for i in range(recipients))
    msg["Subject"] = "Harbour schedule"
    msg["Date"] = "Tue, 03 Sep 2024 10:15:00 +0000"
    msg.set_content("The ferry leaves the harbour at nine every morning.")
    for i in range(attachments):
        msg.add_attachment(
            f"Note {i}: the tide table for pier {i}.".encode(),
            maintype="text",
            subtype="plain",
            filename=f"note{i:03d}.txt",
        )
    return msg.as_bytes()


def test_an_email_with_200_recipients_is_indexed_or_clearly_refused(client):
    data = eml(recipients=200)
    assert len(data) > 4000
    indexed_or_clearly_refused(upload(client, "crowd.eml", data, index="mail"))


@pytest.mark.slow
def test_an_eml_with_300_attachments_is_indexed_or_clearly_refused(client):
    indexed_or_clearly_refused(upload(client, "many.eml", eml(attachments=300), index="mail"))


@pytest.mark.slow
def test_a_msg_with_100_attachments_is_indexed_or_clearly_refused(client):
    data = msg_bytes(
        sender=("Grace Hopper", "grace@example.org"),
        to=[Recipient("Alan Turing", "alan@example.org")],
        subject="Tide tables",
        body="The tide tables for every pier are attached.",
        sent=datetime(2024, 5, 6, 9, 30, tzinfo=UTC),
        attachments=[(f"pier{i:03d}.txt", f"Pier {i} floods at spring tide.".encode()) for i in range(100)],
    )
    indexed_or_clearly_refused(upload(client, "many.msg", data, index="mail"))


# -- unbounded indexing -----------------------------------------------------------------------------------------


def test_a_document_of_more_chunks_than_the_setting_is_refused_with_413_naming_the_limit(client):
    paragraphs = [f"Paragraph {i}. " + " ".join(f"word{i}x{j}" for j in range(120)) + "." for i in range(60)]
    resp = upload(client, "long.txt", "\n\n".join(paragraphs).encode(), index="chunks")
    assert resp.status_code == 413, f"{resp.status_code}: {resp.text[:300]}"
    assert str(MAX_CHUNKS) in resp.json()["error"], resp.json()
    listed = client.get("/get_documents", params={"index": "chunks"})
    assert listed.status_code == 404 or listed.json() == [], listed.text[:300]  # refused: nothing stored


def test_attachments_past_the_setting_are_skipped_and_each_reported_the_message_indexed(client):
    resp = upload(client, "bundle.eml", eml(attachments=MAX_ATTACHMENTS + 2), index="bundle")
    assert resp.status_code == 200, resp.text[:300]
    outcomes = resp.json()["attachments"]
    assert [a["filename"] for a in outcomes] == [
        f"bundle.eml.note{i:03d}.txt" for i in range(MAX_ATTACHMENTS + 2)
    ]
    assert all(a.get("chunks", 0) >= 1 for a in outcomes[:MAX_ATTACHMENTS]), outcomes
    for skipped in outcomes[MAX_ATTACHMENTS:]:
        assert skipped["code"] == "too_many_attachments" and str(MAX_ATTACHMENTS) in skipped["error"], skipped
    listed = sorted(f for _, f in documents(client, "bundle"))
    assert listed == ["bundle.eml", *(f"bundle.eml.note{i:03d}.txt" for i in range(MAX_ATTACHMENTS))], listed


# -- file names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("control", ["\u202e", "\u202d", "\u2066", "\u2067", "\u200f"])
def test_a_file_name_with_a_bidi_control_is_refused(client, control):
    """`invoice\u202efdp.txt` shows as `invoicetxt.pdf`: a spoofed extension."""
    name = f"invoice{control}fdp.txt"
    resp = client.post(
        "/add_document",
        data={"index": "names", "filename": name},
        files={"file": ("upload.txt", b"The invoice is due on Friday.")},
    )
    body = clear_refusal(resp)
    assert resp.status_code == 400 and body.get("field") in (None, "filename"), body


def test_an_attachment_with_a_long_name_keeps_its_prefix_and_goes_with_its_message(client):
    msg = EmailMessage()
    msg["From"] = "ada@example.org"
    msg["To"] = "charles@example.org"
    msg["Subject"] = "Long names"
    msg.set_content("The contract is attached.")
    long_name = "contract-" + "x" * 236 + ".txt"  # 249 bytes: with the message's name it passes 255
    msg.add_attachment(
        b"Clause 9: the quince orchard is leased for ninety years.",
        maintype="text",
        subtype="plain",
        filename=long_name,
    )
    resp = upload(client, "memo.eml", msg.as_bytes(), index="long")
    assert resp.status_code == 200, resp.text[:300]
    names = sorted(f for _, f in documents(client, "long"))
    assert len(names) == 2 and all(n == "memo.eml" or n.startswith("memo.eml.") for n in names), names
    resp = client.post("/delete", json={"index": "long", "dataset": "default", "filename": "memo.eml"})
    assert resp.status_code == 200, resp.text
    assert documents(client, "long") == {}


# -- oversized images -------------------------------------------------------------------------------------------


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares a huge picture (a decompression bomb by its dimensions)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def test_an_oversized_image_is_refused_with_a_specific_code_and_no_raw_exception(client):
    resp = upload(client, "huge.png", png_declaring(40000, 40000), index="images")
    body = clear_refusal(resp)
    for raw in ("DecompressionBomb", "Traceback", "PIL", "exceeds limit", "pixels, could be"):
        assert raw not in body["error"], body
