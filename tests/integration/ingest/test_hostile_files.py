"""Hostile and unlucky files against the real worker: a PDF of thousands of pages, a spreadsheet that
lies about its size, a file that needs more memory or time than conversion may take. Conversion runs in a child
process: the worker's own memory stays where it was and other turns keep streaming meanwhile."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import psutil
import pytest

from tests.hostile import many_page_pdf, xlsx_declaring
from tests.integration.ingest.helpers import documents, start_worker, upload
from tests.ollama_server import OLLAMA_ENV

MB = 1024 * 1024


def worker_processes(server) -> list[psutil.Process]:
    """The gunicorn workers (the processes that serve requests), children of the master `serve` started: one,
    or WORKER_WORKERS (TEST_WORKER_WORKERS) of them, any of which may take a request."""
    procs = psutil.Process(server.proc.pid).children()
    assert procs, "the worker's master has no serving process"
    return procs


def conversion_job(server, timeout: float = 300) -> psutil.Process:
    """The process converting a file right now: a fork of the worker's sandbox helper.

    Only a fork counts (it has the helper's command line): while the helper warms up, Docling's import runs
    `uname -p` as its child, and stopping that one instead stops the helper before it ever starts the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        helpers = [h for worker in worker_processes(server) for h in _children(worker)]
        for helper in helpers:
            with contextlib.suppress(psutil.Error):
                command = helper.cmdline()
                if "rag_worker.sandbox" in " ".join(command):
                    jobs = [p for p in helper.children() if _command(p) == command]
                    if jobs:
                        return jobs[0]
        time.sleep(0.05)
    raise AssertionError("no conversion ran in a child process of the worker")


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children()
    except psutil.Error:  # ended meanwhile
        return []


def _command(process: psutil.Process) -> list[str] | None:
    try:
        return process.cmdline()
    except psutil.Error:  # ended meanwhile
        return None


def nothing_stored(client, tmp, index: str) -> None:
    if (tmp / "index_store" / "lancedb" / f"{index}.lance").exists():
        assert documents(client, index) == {}
    assert not any(p.is_file() for p in (tmp / "shared_uploads").glob(f"{index}/**/*"))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile_files")


@pytest.fixture(scope="module")
def worker(tmp):
    """Default MAX_PDF_PAGES; 48 MB for a conversion (plenty for ordinary files); MAX_SPREADSHEET_CELLS 5000."""
    server = start_worker(tmp, CONVERT_MAX_MEMORY_MB="48")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(worker):
    with httpx.Client(base_url=worker.url, timeout=300) as c:
        # An ordinary PDF converts within the same limits (and the embedder and the sandbox are warm after it).
        resp = upload(c, "brochure.pdf", many_page_pdf(3, "Boats moor at the north quay."), index="ordinary")
        assert resp.status_code == 200, resp.text
        yield c


def test_a_pdf_of_more_than_2000_pages_is_refused_before_conversion(client, tmp):
    data = many_page_pdf(2001)
    assert len(data) < 512 * 1024, "a few hundred kilobytes hold thousands of pages"
    resp = upload(client, "atlas.pdf", data, index="hostile")
    assert resp.status_code == 413, resp.text
    body = resp.json()
    assert body["code"] == "too_many_pages" and "MAX_PDF_PAGES" in body["error"] and "2,001" in body["error"]
    nothing_stored(client, tmp, "hostile")


def test_a_spreadsheet_that_lies_about_its_size_is_refused(client, tmp):
    resp = upload(client, "liar.xlsx", xlsx_declaring(600, 10, "A1:A1"), index="hostile")
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "too_many_cells" and "MAX_SPREADSHEET_CELLS" in resp.json()["error"]
    nothing_stored(client, tmp, "hostile")


def test_a_file_needing_more_memory_is_a_422_and_the_worker_keeps_its_memory(client, worker, tmp):
    serving = worker_processes(worker)  # whichever of them takes the uploads, none may grow
    before = [p.memory_info().rss for p in serving]
    for _ in range(3):
        resp = upload(client, "heavy.pdf", many_page_pdf(1500), index="hostile")
        assert resp.status_code == 422, resp.text
        assert resp.json()["code"] == "convert_memory" and "CONVERT_MAX_MEMORY_MB" in resp.json()["error"]
    grown = max(p.memory_info().rss - rss for p, rss in zip(serving, before, strict=True))
    assert grown < 64 * MB, f"the worker grew by {grown / MB:.0f} MB converting a file it refused"
    nothing_stored(client, tmp, "hostile")
    # ... and it goes on indexing ordinary files.
    again = upload(client, "notes.txt", b"The north quay closes at dusk.", index="ordinary")
    assert again.status_code == 200, again.text


# -- time limit, and the event loop while a conversion runs -----------------------------------------------------


@pytest.fixture(scope="module")
def chat_worker(tmp_path_factory, fake_ollama_server):
    server = start_worker(
        tmp_path_factory.mktemp("hostile_chat"),
        OLLAMA_HOST=fake_ollama_server.url,
        CONVERT_TIMEOUT_S="60",
        **OLLAMA_ENV,
    )
    yield server
    server.stop()


def test_turns_stream_while_a_conversion_is_stuck_and_the_stuck_one_is_stopped(chat_worker, fake_ollama):
    with httpx.Client(base_url=chat_worker.url, timeout=300) as c:
        resp = upload(c, "ducks.txt", b"Ducks eat water plants, seeds and small insects.", index="pond")
        assert resp.status_code == 200, resp.text
        outcome: dict = {}

        def send() -> None:
            with httpx.Client(base_url=chat_worker.url, timeout=300) as other:
                outcome["resp"] = upload(other, "atlas.pdf", many_page_pdf(2000), index="pond")

        sender = threading.Thread(target=send)
        sender.start()
        job = conversion_job(chat_worker)
        job.suspend()  # SIGSTOP: this conversion cannot finish now, whatever the machine's speed
        try:
            events = []
            body = {"prompt": "What do ducks eat?", "index": "pond"}
            with c.stream("POST", "/chat_stream", json=body) as stream:
                assert stream.status_code == 200
                events = [line[7:] for line in stream.iter_lines() if line.startswith("event: ")]
            assert "token" in events and events[-1] == "done", events
            assert job.status() == psutil.STATUS_STOPPED, "the turn ran while the conversion was stuck"
        finally:
            sender.join(timeout=600)
        resp = outcome["resp"]
        assert resp.status_code == 422, resp.text
        assert resp.json()["code"] == "convert_timeout" and "CONVERT_TIMEOUT_S" in resp.json()["error"]
        assert not job.is_running() or job.status() == psutil.STATUS_ZOMBIE, "the stuck conversion was killed"
        assert set(documents(c, "pond")) == {("default", "ducks.txt")}
