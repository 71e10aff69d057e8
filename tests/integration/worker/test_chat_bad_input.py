"""Malformed, oversized and hostile chat requests get a clear 4xx JSON error, never a 500 or a broken stream."""

from __future__ import annotations

import httpx
import pytest

BAD = [
    ({}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "   "}, 400, "prompt"),
    ({"prompt": 42}, 400, "prompt"),
    ({"prompt": ["a"]}, 400, "prompt"),
    ({"prompt": "x" * 8001}, 400, "prompt"),
    ({"prompt": "hi", "history": "not a list"}, 400, "history"),
    ({"prompt": "hi", "history": [{"role": "robot", "content": "beep"}]}, 400, "history.0.role"),
    ({"prompt": "hi", "history": [{"role": "user"}]}, 400, "history.0.content"),
    ({"prompt": "hi", "history": [{"role": "user", "content": 5}]}, 400, "history.0.content"),
    ({"prompt": "hi", "docs": [{"id": 1, "text": "x"}]}, 400, "docs.0.id"),
    ({"prompt": "hi", "datasets": "animals"}, 400, "datasets"),
    ({"prompt": "hi", "datasets": ["../etc"]}, 400, "datasets"),
    ({"prompt": "hi", "datasets": ["a' OR 1=1 --"]}, 400, "datasets"),
    ({"prompt": "hi", "index": "../../etc/passwd"}, 400, "index"),
    ({"prompt": "hi", "index": "bad name"}, 400, "index"),
    ({"prompt": "hi", "index": []}, 400, "index"),
    ({"prompt": "hi", "index": "x" * 65}, 400, "index"),
    ({"prompt": "hi", "options": {"route": "sideways"}}, 400, "options.route"),
    ({"prompt": "hi", "options": {"top_k": "5"}}, 400, "options.top_k"),
    ({"prompt": "hi", "options": {"top_k": 0}}, 400, "options.top_k"),
    ({"prompt": "hi", "options": {"temperature": 9}}, 400, "options.temperature"),
    ({"prompt": "hi", "options": "fast"}, 400, "options"),
    ({"prompt": "hi", "history": [{"role": "user", "content": "x"}] * 201}, 413, "history"),
    ({"prompt": "hi", "history": [{"role": "user", "content": "x" * 100_000}] * 3}, 413, "history"),
    ({"prompt": "hi", "docs": [{"id": str(i), "text": "x"} for i in range(51)]}, 413, "docs"),
]


@pytest.mark.parametrize("route", ["/chat", "/chat_stream"])
@pytest.mark.parametrize(("body", "status", "field"), BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_chat_bodies_are_4xx_json(worker, route, body, status, field):
    resp = httpx.post(worker.url + route, json=body, timeout=30)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()
    assert err["field"] == field and err["code"] and err["error"]


@pytest.mark.parametrize("route", ["/chat", "/chat_stream"])
def test_unknown_index_is_404(worker, route):
    resp = httpx.post(worker.url + route, json={"prompt": "hi", "index": "nosuchindex"})
    assert resp.status_code == 404 and resp.json()["code"] == "index_not_found"
    assert "nosuchindex" in resp.json()["error"]


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1, 2, 3]", b'"just a string"', b"{", b"\xff\xfe\x00garbage", b"null"],
)
def test_non_object_bodies_are_400(worker, raw):
    resp = httpx.post(worker.url + "/chat", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["code"] in {"bad_json", "bad_request"}


def test_unknown_fields_are_ignored(worker, fake_ollama):
    resp = httpx.post(
        worker.url + "/chat",
        json={"prompt": "hello", "index": "corpus", "mood": "happy", "options": {"route": "direct"}},
        timeout=60,
    )
    assert resp.status_code == 200 and resp.json()["route"] == "direct"


@pytest.mark.parametrize("route", ["/chat", "/chat_stream"])
@pytest.mark.parametrize(
    ("key", "hint"), [("topK", "top_k"), ("TOP-K", "top_k"), ("answerMode", "answer_mode"), ("colour", None)]
)
def test_an_unknown_option_is_refused_naming_it(worker, route, key, hint):
    """An option the worker does not know would otherwise be dropped without a word: `topK: 3` ran with 5."""
    body = {"prompt": "hello", "index": "corpus", "options": {"route": "direct", key: 3}}
    resp = httpx.post(worker.url + route, json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert err["field"] == f"options.{key}" and err["code"] == "unknown_option"
    assert key in err["error"]
    if hint:
        assert f"did you mean '{hint}'" in err["error"]
    else:
        assert "did you mean" not in err["error"] and "top_k" in err["error"], "it lists the known options"


def test_an_unknown_option_is_refused_on_the_openai_route_too(worker):
    body = {"model": "direct", "messages": [{"role": "user", "content": "hi"}], "options": {"topK": 3}}
    resp = httpx.post(worker.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "options.topK" and "did you mean 'top_k'" in error["message"]


def test_oversized_raw_body_is_413(worker):
    resp = httpx.post(
        worker.url + "/chat",
        content=b"x" * (60 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 413 and resp.json()["code"] == "too_large"


def test_unknown_route_and_wrong_method_are_json(worker):
    resp = httpx.get(worker.url + "/nope")
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    resp = httpx.get(worker.url + "/chat")
    assert resp.status_code == 405 and resp.json()["code"] == "method_not_allowed"


def test_hostile_prompt_text_is_just_text(worker, fake_ollama):
    prompt = "'; DROP TABLE corpus; -- \" OR dataset = 'x' AND text:(\"ducks\") NOT eat* ~2 ^3 \\\\"
    resp = httpx.post(
        worker.url + "/chat",
        json={"prompt": prompt, "index": "corpus", "options": {"route": "rag"}},
        timeout=60,
    )
    assert resp.status_code == 200
    again = httpx.post(
        worker.url + "/chat", json={"prompt": "What do ducks eat?", "index": "corpus"}, timeout=60
    )
    assert again.json()["documents"][0]["filename"] == "ducks.md", "the index is intact"


@pytest.mark.parametrize("route", ["/chat", "/chat_stream"])
def test_an_index_built_with_another_embedder_is_409_not_garbage(worker, corpus_root, route):
    from tests.corpus import build_foreign_index

    build_foreign_index(corpus_root / "index_store" / "lancedb", "foreign")
    resp = httpx.post(worker.url + route, json={"prompt": "What is old?", "index": "foreign"}, timeout=60)
    assert resp.status_code == 409 and resp.json()["code"] == "embedder_mismatch"
    assert "example/other-embedder" in resp.json()["error"] and "rebuild" in resp.json()["error"].lower()
