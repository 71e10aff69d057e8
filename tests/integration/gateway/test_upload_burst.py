"""A burst of concurrent uploads through the gateway to a worker of two gunicorn processes (issue 27: one in 40
once failed with 503 "unreachable (RemoteProtocolError)" and the two sides then disagreed about the list).

Ten rounds of 20 concurrent uploads, each round into a fresh index, on one worker and one gateway: every upload
succeeds, and every file is listed exactly once by the gateway and by the worker.
"""

from __future__ import annotations

import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.gateway.helpers import register
from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import gateway_process, worker_process

ROUNDS, BURST = 10, 20

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("upload-burst")
    with contextlib.ExitStack() as es:
        ollama = es.enter_context(FakeOllama())
        worker_env = {
            "WORKER_WORKERS": "2",
            "OLLAMA_HOST": ollama.url,
            "TORCH_THREADS": "1",
            "OVERVIEW_SUMMARIES": "off",
            **OLLAMA_ENV,
        }
        worker = es.enter_context(worker_process(tmp, env=worker_env))
        gateway = es.enter_context(
            gateway_process(tmp, worker_url=worker.url, env={"OLLAMA_HOST": ollama.url})
        )
        yield worker, gateway, tmp


def worker_table(tmp, index_id: int) -> str:
    """The worker table behind a gateway index (the API does not show it), from the gateway's database."""
    with sqlite3.connect(tmp / "index_store" / "gateway.db") as db:
        return db.execute("SELECT worker_name FROM indexes WHERE id = ?", (index_id,)).fetchone()[0]


def note(round_no: int, i: int) -> bytes:
    return f"# Note {round_no}-{i}\n\nThe heron number {round_no * 100 + i} stands in the reeds.\n".encode()


def test_every_upload_of_ten_bursts_is_listed_once_on_both_sides(stack):
    worker, gateway, tmp = stack
    with httpx.Client(base_url=gateway.url, timeout=300) as api:
        user = register(api, "burster")

        def upload(index_id: int, round_no: int, i: int) -> httpx.Response:
            with httpx.Client(base_url=gateway.url, timeout=300) as one:
                return one.post(
                    f"/api/indexes/{index_id}/documents",
                    headers=user,
                    data={"dataset": "default"},
                    files={"file": (f"note-{i:02d}.md", note(round_no, i), "text/markdown")},
                )

        with ThreadPoolExecutor(BURST) as pool:
            for round_no in range(ROUNDS):
                index = api.post("/api/indexes", json={"name": f"Burst {round_no}"}, headers=user).json()
                ids, rounds = [index["id"]] * BURST, [round_no] * BURST
                answers = list(pool.map(upload, ids, rounds, range(BURST)))
                failed = [(r.status_code, r.text) for r in answers if r.status_code != 201]
                assert not failed, f"round {round_no}: {len(failed)} of {BURST} uploads failed: {failed[:3]}"
                expected = sorted(f"note-{i:02d}.md" for i in range(BURST))
                listed = api.get(f"/api/indexes/{index['id']}", headers=user).json()["documents"]
                assert sorted(d["filename"] for d in listed) == expected, f"round {round_no}: the gateway"
                on_worker = httpx.get(
                    worker.url + "/get_documents",
                    params={"index": worker_table(tmp, index["id"])},
                    timeout=60,
                )
                assert on_worker.status_code == 200, on_worker.text
                assert sorted(d["filename"] for d in on_worker.json()) == expected, (
                    f"round {round_no}: worker"
                )
