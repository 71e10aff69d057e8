"""E-mail, legacy/open office files and EPUB through the real worker: each indexes and is found by its phrase."""

from __future__ import annotations

import io
import json
import zipfile

import httpx
import pytest

from rag_worker.ingest.ocr import tesseract
from tests.format_samples import (
    PHRASES,
    eml_bytes,
    eml_html_only_bytes,
    epub_bytes,
    msg_bytes,
    office_samples,
    soffice,
)
from tests.integration.ingest.helpers import StoreReader, documents, sse_events, start_worker, upload
from tests.unit.test_ocr import PHOTO_PHRASE, SCAN_PHRASE, scan_pdf, text_image


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


@pytest.fixture(scope="module")
def worker(tmp):
    server = start_worker(tmp)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(worker):
    with httpx.Client(base_url=worker.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def reader(tmp, worker):
    return StoreReader(tmp)


def test_an_eml_indexes_headers_body_and_each_attachment_as_its_own_document(client, reader, tmp):
    resp = upload(client, "invoice.eml", eml_bytes(), index="mail", dataset="inbox")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["filename"] == "invoice.eml" and body["chunks"] >= 1
    # The text attachment is its own document; the binary one is only named in the message.
    assert [a["filename"] for a in body["attachments"]] == ["invoice.eml.contract.txt"]
    assert body["attachments"][0]["chunks"] >= 1
    docs = documents(client, "mail")
    assert set(docs) == {("inbox", "invoice.eml"), ("inbox", "invoice.eml.contract.txt")}

    assert reader.files_for(PHRASES["eml"], "mail")[0] == "invoice.eml"
    assert reader.files_for(PHRASES["attachment"], "mail")[0] == "invoice.eml.contract.txt"
    message = reader.search(PHRASES["eml"], "mail")[0]
    assert message.metadata["email"]["from"] == "Ada Lovelace <ada@example.org>"
    assert message.metadata["email"]["subject"] == "Invoice for the analytical engine"
    assert "Ada Lovelace" in message.text or any(
        "Ada Lovelace" in h.text for h in reader.search("Lovelace Babbage", "mail")
    )
    attachment = reader.search(PHRASES["attachment"], "mail")[0]
    assert attachment.metadata["attached_to"] == "invoice.eml"
    # The attachment's original is kept like an upload, so it can be downloaded.
    original = client.get(
        "/get_document", params={"index": "mail", "dataset": "inbox", "filename": "invoice.eml.contract.txt"}
    )
    assert original.status_code == 200 and PHRASES["attachment"].encode() in original.content


def test_an_outlook_msg_indexes_its_body_and_each_attachment_as_its_own_document(client, reader, tmp):
    resp = upload(client, "audit.msg", msg_bytes(), index="outlook", dataset="inbox")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["filename"] == "audit.msg" and body["chunks"] >= 1
    assert sorted(a["filename"] for a in body["attachments"]) == [
        "audit.msg.appendix.txt",
        "audit.msg.ward costs.csv",
    ]
    assert all(a["chunks"] >= 1 for a in body["attachments"]), body
    assert set(documents(client, "outlook")) == {
        ("inbox", "audit.msg"),
        ("inbox", "audit.msg.appendix.txt"),
        ("inbox", "audit.msg.ward costs.csv"),
    }
    assert reader.files_for(PHRASES["msg"], "outlook")[0] == "audit.msg"
    message = reader.search(PHRASES["msg"], "outlook")[0]
    assert message.metadata["email"]["from"] == "Grace Hopper <grace@example.org>"
    assert message.metadata["email"]["subject"] == "Bell tower audit"
    attachment = reader.search(PHRASES["msg_attachment"], "outlook")[0]
    assert (attachment.filename, attachment.metadata["attached_to"]) == (
        "audit.msg.appendix.txt",
        "audit.msg",
    )
    # The attached spreadsheet is an SQL table of the index too.
    cards = [json.loads(p.read_text()) for p in (tmp / "index_store" / "tables" / "outlook").glob("*.json")]
    assert [c["filename"] for c in cards] == ["audit.msg.ward costs.csv"]
    # Deleting the message deletes its attachments and their table.
    gone = client.post("/delete", json={"index": "outlook", "dataset": "inbox", "filename": "audit.msg"})
    assert gone.status_code == 200, gone.text
    assert documents(client, "outlook") == {}
    assert not list((tmp / "index_store" / "tables" / "outlook").glob("*.json"))


def test_an_html_only_eml_is_read_as_text_without_its_script(client, reader):
    resp = upload(client, "news.eml", eml_html_only_bytes(), index="mail")
    assert resp.status_code == 200, resp.text
    hits = reader.search(PHRASES["eml_html"], "mail")
    assert hits[0].filename == "news.eml"
    assert "alert(1)" not in " ".join(h.text for h in hits if h.filename == "news.eml")


def test_an_epub_is_read_chapter_by_chapter(client, reader):
    resp = upload(client, "atlas.epub", epub_bytes(), index="books")
    assert resp.status_code == 200, resp.text
    assert reader.files_for(PHRASES["epub"], "books")[0] == "atlas.epub"
    assert reader.files_for("maps were blank", "books")[0] == "atlas.epub"


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("fake.doc", b"just text pretending to be Word", "unsupported_type"),
        ("fake.odt", b"PK\x03\x04 not a zip at all", "unsupported_type"),
        ("fake.msg", b"From: someone\n\nplain text", "unsupported_type"),
        ("fake.rtf", b"%PDF-1.4 not rtf", "unsupported_type"),
        ("fake.epub", b"not an epub", "unsupported_type"),
    ],
)
def test_a_file_that_is_not_what_its_name_says_is_refused(client, name, data, code):
    resp = upload(client, name, data, index="spoof")
    assert resp.status_code == 415, resp.text
    assert resp.json()["code"] == code


def test_an_opendocument_zip_bomb_is_refused_before_conversion(client):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.text")
        zf.writestr("content.xml", b"\0" * (20 * 1024 * 1024))  # inflates past the 16 MiB test bound
    resp = upload(client, "bomb.odt", out.getvalue(), index="spoof")
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "zip_bomb"


def test_an_epub_without_a_package_document_is_a_400(client):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        zf.writestr("META-INF/container.xml", "<container/>")
    resp = upload(client, "broken.epub", out.getvalue(), index="spoof")
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "corrupt"


@pytest.mark.slow
@pytest.mark.skipif(
    soffice() is None, reason="LibreOffice is not installed (scripts/setup.sh --dev installs it)"
)
def test_legacy_and_open_office_files_index_and_are_found_by_their_phrase(client, reader, tmp):
    samples = office_samples(tmp / "office")
    for kind, path in samples.items():
        resp = upload(client, path.name, path.read_bytes(), index="office")
        assert resp.status_code == 200, (kind, resp.text)
        assert resp.json()["chunks"] >= 1
    for kind, path in samples.items():
        assert reader.files_for(PHRASES[kind], "office")[0] == path.name, kind
    # Old and open spreadsheets are SQL tables too.
    cards = {
        json.loads(p.read_text())["filename"]: json.loads(p.read_text())
        for p in (tmp / "index_store" / "tables" / "office").glob("*.json")
    }
    for name in ("xls_sample.xls", "ods_sample.ods"):
        columns = {c["name"]: c["type"] for c in cards[name]["columns"]}
        assert columns["units"] in ("BIGINT", "DOUBLE") and columns["revenue"] == "DOUBLE"


@pytest.mark.skipif(
    tesseract() is None, reason="tesseract is not installed (scripts/setup.sh --dev installs it)"
)
def test_a_scan_and_a_photo_are_found_by_their_phrase_and_health_reports_ocr(client, reader, tmp):
    scan = scan_pdf(tmp / "scan.pdf", SCAN_PHRASE.capitalize() + ".")
    photo = tmp / "photo.jpg"
    text_image(PHOTO_PHRASE.capitalize() + ".").save(photo)
    for path in (scan, photo):
        resp = upload(client, path.name, path.read_bytes(), index="scans")
        assert resp.status_code == 200, resp.text
    hit = reader.search(SCAN_PHRASE, "scans")[0]
    assert hit.filename == "scan.pdf" and hit.page == 1
    assert reader.files_for(PHOTO_PHRASE, "scans")[0] == "photo.jpg"
    health = client.get("/health").json()
    assert health["ocr"]["available"] is True and health["ocr"]["languages"] == ["eng"]
    assert health["ocr"]["office"] is (soffice() is not None)


def test_deleting_a_message_deletes_its_attachment_documents(client):
    resp = upload(client, "memo.eml", eml_bytes(), index="maildel")
    assert resp.status_code == 200, resp.text
    assert set(documents(client, "maildel")) == {
        ("default", "memo.eml"),
        ("default", "memo.eml.contract.txt"),
    }
    gone = client.post("/delete", json={"index": "maildel", "dataset": "default", "filename": "memo.eml"})
    assert gone.status_code == 200, gone.text
    assert documents(client, "maildel") == {}
    original = client.get(
        "/get_document",
        params={"index": "maildel", "dataset": "default", "filename": "memo.eml.contract.txt"},
    )
    assert original.status_code == 404


SCAN_PAGES = ["the otter files nine ledgers", "a copper kettle hums at dusk", "twelve owls guard the archive"]


def _multi_page_scan(path):
    images = [text_image(phrase.capitalize() + ".") for phrase in SCAN_PAGES]
    images[0].save(path, "PDF", save_all=True, append_images=images[1:], resolution=200)
    return path


def _ocr_events(events: list[tuple[str, dict]], filename: str) -> list[dict]:
    return [d for e, d in events if e == "progress" and d["stage"] == "ocr" and d["file"].endswith(filename)]


@pytest.mark.skipif(
    tesseract() is None, reason="tesseract is not installed (scripts/setup.sh --dev installs it)"
)
def test_ocr_reports_each_scanned_page_as_it_reads_it_on_upload_and_rebuild(client, reader, tmp):
    scan = _multi_page_scan(tmp / "ledger-scan.pdf")
    resp = client.post(
        "/add_document",
        data={"index": "ocrprogress"},
        files={"file": (scan.name, scan.read_bytes())},
        headers={"Accept": "text/event-stream"},
    )
    assert resp.status_code == 200, resp.text
    events = sse_events(resp)
    assert events[-1][0] == "done", events[-3:]
    stages = [d["stage"] for e, d in events if e == "progress"]
    # One "ocr" event per scanned page, in page order, between converting and chunking.
    assert stages == ["converting", "ocr", "ocr", "ocr", "chunking", "embedding", "writing"], stages
    assert [d["ocr"] for d in _ocr_events(events, scan.name)] == [
        {"page": 1, "done": 1, "total": 3},
        {"page": 2, "done": 2, "total": 3},
        {"page": 3, "done": 3, "total": 3},
    ]
    for phrase in SCAN_PAGES:  # every page's text was read (short pages share one chunk)
        assert reader.files_for(phrase, "ocrprogress")[0] == scan.name, phrase

    # The folder route (a rebuild reads the upload again) reports the pages the same way, per file.
    rebuilt = client.post("/index", json={"index": "ocrprogress", "rebuild": True})
    assert rebuilt.status_code == 200, rebuilt.text
    events = sse_events(rebuilt)
    assert events[-1][0] == "done", events[-3:]
    pages = _ocr_events(events, scan.name)
    assert [(d["ocr"]["page"], d["ocr"]["done"], d["ocr"]["total"]) for d in pages] == [
        (1, 1, 3),
        (2, 2, 3),
        (3, 3, 3),
    ]
    assert all((d["done"], d["total"]) == (0, 1) for d in pages)  # the folder's file counts are kept
