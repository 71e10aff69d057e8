"""API key enforcement, and the gevent worker staying responsive while models run."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.ollama_server import OLLAMA_ENV
from tests.servers import worker_process

KEY = "s3cret-key-for-tests"


@pytest.fixture(scope="module")
def locked_worker(corpus_root, fake_ollama_server):
    proc = worker_process(
        corpus_root, env={"OLLAMA_HOST": fake_ollama_server.url, "WORKER_API_KEY": KEY, **OLLAMA_ENV}
    )
    with proc:
        yield proc


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/chat"),
        ("POST", "/chat_stream"),
        ("POST", "/create_title"),
        ("GET", "/config"),
        ("GET", "/openapi.json"),
        ("GET", "/get_documents?index=corpus"),
        ("POST", "/add_document"),
        ("POST", "/delete"),
        ("POST", "/index"),
        ("DELETE", "/indexes/corpus"),
    ],
)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {KEY}", "Bearer", KEY])
def test_every_route_but_health_needs_the_key(locked_worker, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    resp = httpx.request(method, locked_worker.url + path, headers=headers, json={"prompt": "hi"})
    assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"


def test_right_key_passes_and_health_is_open(locked_worker, fake_ollama):
    assert httpx.get(locked_worker.url + "/health").status_code == 200
    resp = httpx.post(
        locked_worker.url + "/chat",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"prompt": "What do ducks eat?", "index": "corpus"},
        timeout=60,
    )
    assert resp.status_code == 200 and resp.json()["documents"]
    config = httpx.get(locked_worker.url + "/config", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert config["settings"]["worker_api_key"] == "***" and KEY not in str(config)


def test_a_stream_keeps_flowing_while_another_request_embeds(worker, fake_ollama):
    """CPU-bound model calls run off the gevent loop: a heavy embedding must not freeze another stream."""
    fake_ollama.token_delay_s = 0.05
    fake_ollama.replies.append(" ".join(f"w{i}" for i in range(120)))
    arrivals: list[float] = []

    def stream() -> None:
        body = {"prompt": "hi", "index": "corpus", "options": {"route": "direct"}}
        with httpx.Client(timeout=120) as c, c.stream("POST", worker.url + "/chat_stream", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("event: token"):
                    arrivals.append(time.monotonic())

    t = threading.Thread(target=stream)
    t.start()
    while len(arrivals) < 5:
        time.sleep(0.01)
    # A follow-up with 50 long documents: the fetch check embeds all of them in this request.
    docs = [
        {"id": f"d{i}", "filename": f"f{i}.txt", "text": f"Passage {i} about the migration of geese. " * 60}
        for i in range(50)
    ]
    history = [
        {"role": "user", "content": "Tell me about geese"},
        {"role": "assistant", "content": "Geese..."},
    ]
    t0 = time.monotonic()
    resp = httpx.post(
        worker.url + "/chat",
        json={
            "prompt": "Where do the geese migrate in winter?",
            "history": history,
            "docs": docs,
            "index": "corpus",
            "options": {"route": "rag"},
        },
        timeout=120,
    )
    t1 = time.monotonic()
    t.join()
    assert resp.status_code == 200
    during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if t0 <= b <= t1]
    assert t1 - t0 > 1.0, "the embedding request was too light to prove anything"
    assert len(during) >= 5, "tokens kept arriving while the other request embedded"
    assert max(during) < (t1 - t0) / 3, f"the stream froze for {max(during):.2f} s of {t1 - t0:.2f} s"
