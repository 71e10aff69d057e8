"""The document lifecycle over real HTTP against the real worker (gunicorn + gevent), one worker per module."""

from __future__ import annotations

import io
import threading
import zipfile

import httpx
import pytest

from tests.integration.ingest.helpers import StoreReader, documents, sse_events, start_worker, upload
from tests.servers import SHARED, needs_shared

DOCLING = SHARED / "fixtures" / "docling" / "sources"
needs_docling = needs_shared("fixtures/docling/sources")
ENCRYPTED = (
    SHARED / "fixtures/py-pdf-sample-files/005-libreoffice-writer-password/libreoffice-writer-password.pdf"
)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("ingest_api")


@pytest.fixture(scope="module")
def worker(tmp):
    server = start_worker(tmp)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(worker):
    with httpx.Client(base_url=worker.url, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def reader(tmp, worker):
    return StoreReader(tmp)


# -- replace, no-op, delete --------------------------------------------------------------------------------------


def test_same_name_replaces_and_identical_bytes_are_a_no_op(client, reader):
    first = upload(
        client, "policy.txt", b"Staff may bring a labrador retriever to the office.", index="replace"
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["filename"] == "policy.txt" and body["dataset"] == "default"
    assert body["chunks"] == 1 and body["replaced"] is False
    listed = documents(client, "replace")[("default", "policy.txt")]

    again = upload(
        client, "policy.txt", b"Staff may bring a labrador retriever to the office.", index="replace"
    )
    assert again.status_code == 200
    assert again.json()["replaced"] is False
    assert again.json()["document_id"] == body["document_id"]
    assert documents(client, "replace")[("default", "policy.txt")]["indexed_at"] == listed["indexed_at"]

    new = upload(client, "policy.txt", b"Staff may bring a goldfish bowl to the office.", index="replace")
    assert new.status_code == 200
    assert new.json()["replaced"] is True
    assert new.json()["document_id"] != body["document_id"]
    docs = documents(client, "replace")
    assert list(docs) == [("default", "policy.txt")]
    assert docs[("default", "policy.txt")]["document_id"] == new.json()["document_id"]
    assert reader.files_for("goldfish", "replace") == ["policy.txt"]
    assert reader.files_for("labrador retriever", "replace") == []
    original = client.get(
        "/get_document", params={"index": "replace", "dataset": "default", "filename": "policy.txt"}
    )
    assert original.content == b"Staff may bring a goldfish bowl to the office."


def test_delete_removes_one_file_even_when_another_has_identical_text(client, reader):
    text = b"The quarterly audit of the warehouse inventory happens in October."
    for name in ("copy one.txt", "copy two.txt"):
        assert upload(client, name, text, index="isolation", dataset="audits").status_code == 200
    assert sorted(reader.files_for("warehouse inventory audit", "isolation")) == [
        "copy one.txt",
        "copy two.txt",
    ]

    resp = client.post(
        "/delete", json={"index": "isolation", "dataset": "audits", "filename": "copy one.txt"}
    )
    assert resp.status_code == 200
    assert resp.json() == {"count": 1}
    assert reader.files_for("warehouse inventory audit", "isolation") == ["copy two.txt"]
    assert reader.files_for("warehouse inventory audit", "isolation", mode="vector") == ["copy two.txt"]
    assert list(documents(client, "isolation")) == [("audits", "copy two.txt")]
    gone = client.get(
        "/get_document", params={"index": "isolation", "dataset": "audits", "filename": "copy one.txt"}
    )
    assert gone.status_code == 404
    kept = client.get(
        "/get_document", params={"index": "isolation", "dataset": "audits", "filename": "copy two.txt"}
    )
    assert kept.content == text
    again = client.post(
        "/delete", json={"index": "isolation", "dataset": "audits", "filename": "copy one.txt"}
    )
    assert again.status_code == 404


@needs_docling
def test_concurrent_uploads_to_one_index_both_land(client, worker):
    results: dict[str, int] = {}

    def send(name: str, body: bytes) -> None:
        with httpx.Client(base_url=worker.url, timeout=180) as own:
            results[name] = upload(own, name, body, index="together").status_code

    docx = (DOCLING / "lorem_ipsum.docx").read_bytes()
    pdf = (DOCLING / "multi_page.pdf").read_bytes()
    threads = [threading.Thread(target=send, args=a) for a in (("lorem.docx", docx), ("history.pdf", pdf))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"lorem.docx": 200, "history.pdf": 200}
    docs = documents(client, "together")
    assert set(docs) == {("default", "lorem.docx"), ("default", "history.pdf")}
    assert all(d["chunks"] > 0 for d in docs.values())


def test_an_index_another_process_is_still_creating_reads_as_absent_and_an_upload_lands(client, tmp):
    # LanceDB makes a table's folder before it commits the table's first version: for that moment, this is
    # what another worker process creating the index leaves on disk. Two processes taking the first uploads of a
    # new index at once hit it (one upload answered 500 "internal error: ValueError").
    (tmp / "index_store" / "lancedb" / "creating.lance" / "_versions").mkdir(parents=True)
    listed = client.get("/get_documents", params={"index": "creating"})
    assert listed.status_code == 404 and listed.json()["code"] == "index_not_found"

    resp = upload(client, "first.md", b"# First\n\nThe first note names the wombat.", index="creating")
    assert resp.status_code == 200, resp.text
    assert set(documents(client, "creating")) == {("default", "first.md")}


def test_unicode_and_spaces_in_names_are_kept_for_display(client):
    name = "Zusammenfassung für Büro 2024 – final.md"
    resp = upload(
        client, name, "# Büro\n\nDie Kaffeemaschine steht im zweiten Stock.".encode(), index="names"
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["filename"] == name
    assert ("default", name) in documents(client, "names")
    original = client.get("/get_document", params={"index": "names", "dataset": "default", "filename": name})
    assert original.status_code == 200
    assert "Kaffeemaschine" in original.content.decode()
    assert "attachment" in original.headers["content-disposition"]
    assert client.get("/get_datasets", params={"index": "names"}).json() == ["default"]


def test_what_the_worker_writes_is_private_to_its_user(client, tmp):
    resp = upload(client, "private.md", b"# Salaries\n\nThe salary table is confidential.", index="private")
    assert resp.status_code == 200, resp.text
    original = tmp / "shared_uploads" / "private" / "default" / "private.md"
    assert original.is_file()
    for folder in (original.parent, original.parent.parent):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert original.stat().st_mode & 0o777 == 0o600
    table = tmp / "index_store" / "lancedb" / "private.lance"
    written = [p for p in table.rglob("*") if p.is_file()]
    assert written and all(p.stat().st_mode & 0o077 == 0 for p in written), [
        oct(p.stat().st_mode) for p in written
    ]


# -- bulk indexing -------------------------------------------------------------------------------------------------


@needs_docling
def test_index_reports_a_corrupt_file_and_indexes_the_others(client, reader, tmp):
    folder = tmp / "shared_uploads" / "batch"
    (folder / "manuals").mkdir(parents=True)
    (folder / "kettle.txt").write_text("Descale the kettle with citric acid every month.")
    (folder / "manuals" / "broken.pdf").write_bytes((DOCLING / "multi_page.pdf").read_bytes()[:2500])
    (folder / "manuals" / "word.pdf").write_bytes((DOCLING / "multi_page.pdf").read_bytes())
    (folder / "manuals" / "lorem.docx").write_bytes((DOCLING / "lorem_ipsum.docx").read_bytes())

    resp = client.post("/index", json={"index": "batch"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    names = [e for e, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"progress"}
    failed = [d for e, d in events if e == "progress" and d["stage"] == "failed"]
    assert [f["file"] for f in failed] == ["manuals/broken.pdf"]
    assert failed[0]["code"] == "corrupt" and failed[0]["error"]
    assert {d["stage"] for e, d in events if e == "progress"} >= {
        "converting",
        "embedding",
        "indexed",
        "failed",
    }
    assert all(d["total"] == 4 for e, d in events if e == "progress")
    done = events[-1][1]
    assert done["documents"] == 3 and done["chunks"] > 3 and done["seconds"] >= 0
    assert [f["file"] for f in done["failed"]] == ["manuals/broken.pdf"]

    assert set(documents(client, "batch")) == {
        ("default", "kettle.txt"),
        ("manuals", "word.pdf"),
        ("manuals", "lorem.docx"),
    }
    assert reader.files_for("descale kettle citric", "batch") == ["kettle.txt"]
    assert "word.pdf" in reader.files_for("typewriter word processor", "batch")
    assert client.get("/get_datasets", params={"index": "batch"}).json() == ["default", "manuals"]

    # a second run finds nothing new: every good file is unchanged
    again = sse_events(client.post("/index", json={"index": "batch"}))
    assert again[-1][1]["unchanged"] == 3


def test_drop_index_removes_table_and_overviews(client, tmp):
    assert (
        upload(client, "note.md", b"# Note\n\nFerries leave the harbour hourly.", index="dropme").status_code
        == 200
    )
    overviews = tmp / "index_store" / "overviews" / "dropme.jsonl"
    assert "Ferries" in overviews.read_text()
    resp = client.delete("/indexes/dropme")
    assert resp.status_code == 200
    assert not overviews.exists()
    assert client.get("/get_documents", params={"index": "dropme"}).status_code == 404
    assert client.delete("/indexes/dropme").status_code == 404


# -- embedder mismatch ---------------------------------------------------------------------------------------------


def test_an_index_built_with_another_embedder_is_refused_until_rebuilt(client, tmp):
    from tests.corpus import build_foreign_index

    build_foreign_index(tmp / "index_store" / "lancedb", "foreign")
    (tmp / "shared_uploads" / "foreign").mkdir(parents=True)
    (tmp / "shared_uploads" / "foreign" / "fresh.txt").write_text("Fresh text about lighthouses.")

    resp = upload(client, "new.txt", b"New text.", index="foreign")
    assert resp.status_code == 409
    assert resp.json()["code"] == "embedder_mismatch"
    assert "example/other-embedder" in resp.json()["error"]
    resp = client.post("/index", json={"index": "foreign"})
    assert resp.status_code == 409 and resp.json()["code"] == "embedder_mismatch"

    rebuilt = sse_events(client.post("/index", json={"index": "foreign", "rebuild": True}))
    assert rebuilt[-1] == ("done", rebuilt[-1][1]) and rebuilt[-1][1]["documents"] == 1
    # old.txt has no file in the folder: a rebuild keeps it (embedded again with this worker's model) ...
    assert rebuilt[-1][1]["kept"] == 1
    assert set(documents(client, "foreign")) == {("default", "fresh.txt"), ("default", "old.txt")}
    assert upload(client, "new.txt", b"New text.", index="foreign").status_code == 200
    # ... unless prune is asked.
    pruned = sse_events(client.post("/index", json={"index": "foreign", "rebuild": True, "prune": True}))
    assert pruned[-1][0] == "done" and pruned[-1][1]["kept"] == 0
    assert set(documents(client, "foreign")) == {("default", "fresh.txt"), ("default", "new.txt")}


# -- bad input -----------------------------------------------------------------------------------------------------


def _bomb_docx() -> bytes:
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(DOCLING / "lorem_ipsum.docx") as src,
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("word/media/filler.bin", b"\x00" * (32 * 1024 * 1024))
    return buf.getvalue()


def _big_xlsx() -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    for r in range(1000):
        wb.active.append([r, r * 2, r * 3, r * 4, r * 5, r * 6])
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "status", "code"),
    [
        ("../../etc/passwd.txt", b"root", 400, "path_in_filename"),
        ("sub/dir/notes.txt", b"notes", 400, "path_in_filename"),
        ("C:\\Users\\me\\notes.txt", b"notes", 400, "path_in_filename"),
        ("setup.exe", b"MZ\x90\x00", 415, "unsupported_type"),
        ("photo.pdf", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, 415, "unsupported_type"),
        ("letter.docx", b"plain text pretending", 415, "unsupported_type"),
        ("empty.txt", b"", 400, "empty"),
        pytest.param(
            "locked.pdf", None, 400, "encrypted", marks=needs_shared("fixtures/py-pdf-sample-files")
        ),
        pytest.param("broken.pdf", None, 400, "corrupt", marks=needs_shared("fixtures/docling/sources")),
        pytest.param("bomb.docx", None, 413, "zip_bomb", marks=needs_docling),
        ("huge.xlsx", None, 413, "too_many_cells"),
        ("big.txt", b"word " * 700_000, 413, "too_large"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_bad_uploads_are_refused_and_change_nothing(client, tmp, name, data, status, code):
    data = {
        "bomb.docx": _bomb_docx,
        "huge.xlsx": _big_xlsx,
        "locked.pdf": ENCRYPTED.read_bytes,
        "broken.pdf": lambda: (DOCLING / "multi_page.pdf").read_bytes()[:2500],
    }.get(name, lambda: data)()
    resp = upload(client, name, data, index="hostile")
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == code and body["error"]
    if (tmp / "index_store" / "lancedb" / "hostile.lance").exists():
        assert documents(client, "hostile") == {}
    assert not any(p.is_file() for p in (tmp / "shared_uploads").glob("hostile/**/*"))
    incoming = tmp / "shared_uploads" / ".incoming"
    assert not incoming.exists() or not any(incoming.iterdir())


def test_an_upload_far_over_the_limit_is_refused(client):
    resp = upload(client, "huge.txt", b"x" * (6 * 1024 * 1024), index="hostile")
    assert resp.status_code == 413
    assert resp.json()["code"] == "too_large"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("post", "/add_document", {"data": {"index": "x"}}, 400, "missing_field"),
        (
            "post",
            "/add_document",
            {"data": {"index": "bad name!"}, "files": {"file": ("a.txt", b"a")}},
            400,
            "bad_name",
        ),
        (
            "post",
            "/add_document",
            {"data": {"dataset": "../up"}, "files": {"file": ("a.txt", b"a")}},
            400,
            "bad_name",
        ),
        ("get", "/get_documents", {"params": {"index": "missing"}}, 404, "index_not_found"),
        ("get", "/get_datasets", {"params": {"index": "missing"}}, 404, "index_not_found"),
        ("get", "/get_documents", {"params": {"index": "no/slash"}}, 400, "bad_name"),
        (
            "get",
            "/get_document",
            {"params": {"index": "missing", "filename": "a.txt"}},
            404,
            "index_not_found",
        ),
        (
            "get",
            "/get_document",
            {"params": {"index": "replace", "filename": "../../etc/passwd"}},
            400,
            "path_in_filename",
        ),
        (
            "get",
            "/get_document",
            {"params": {"index": "replace", "filename": "nope.txt"}},
            404,
            "document_not_found",
        ),
        ("post", "/delete", {"json": {"index": "missing", "filename": "a.txt"}}, 404, "index_not_found"),
        ("post", "/delete", {"json": {"index": "replace"}}, 400, "missing_field"),
        ("post", "/delete", {"json": {"index": "replace", "filename": 5}}, 400, "invalid_field"),
        (
            "post",
            "/delete",
            {"content": b"not json", "headers": {"content-type": "application/json"}},
            400,
            "bad_json",
        ),
        ("post", "/index", {"json": {"index": "missing"}}, 404, "index_not_found"),
        ("post", "/index", {"json": {"index": "replace", "rebuild": "yes"}}, 400, "invalid_field"),
        ("delete", "/indexes/missing", {}, 404, "index_not_found"),
        ("delete", "/indexes/bad%20name", {}, 400, "bad_name"),
    ],
)
def test_bad_requests_are_json_errors(client, method, path, kwargs, status, code):
    resp = getattr(client, method)(path, **kwargs) if method != "post" else client.post(path, **kwargs)
    assert resp.status_code == status, resp.text
    assert resp.json()["code"] == code
