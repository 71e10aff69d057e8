"""The fake OpenAI-compatible server, checked against the real `openai` SDK: what it answers is what the SDK reads."""

from __future__ import annotations

import time

import openai
import pytest

from tests.openai_server import FakeOpenAI

ASK = [{"role": "user", "content": "tell me something"}]


@pytest.fixture
def fake():
    with FakeOpenAI(models=["qwen3:8b", "qwen3:0.6b"], api_key="k") as server:
        yield server


@pytest.fixture
def client(fake):
    with openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0) as c:
        yield c


def wait_for(entry: dict, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while not (entry["aborted"] or entry["finished"]) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_models_and_a_plain_completion_parse_into_the_sdk_types(client, fake):
    assert [m.id for m in client.models.list()] == ["qwen3:8b", "qwen3:0.6b"]
    resp = client.chat.completions.create(model="qwen3:8b", messages=ASK, temperature=0.1)
    assert resp.choices[0].message.content == "Hello! I am a test model. You said: tell me something"
    assert resp.choices[0].finish_reason == "stop" and resp.usage.completion_tokens > 3
    assert fake.requests[-1]["body"]["temperature"] == 0.1


def test_a_stream_arrives_piece_by_piece_and_ends_with_a_finish_reason(client, fake):
    fake.replies.append("one two three four")
    chunks = list(
        client.chat.completions.create(
            model="qwen3:8b", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
    )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["one ", "two ", "three ", "four"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 4


def test_max_tokens_and_stop_cut_the_reply(client, fake):
    fake.replies.extend(["a b c d e", "alpha beta STOP gamma"])
    cut = client.chat.completions.create(model="qwen3:8b", messages=ASK, max_tokens=2)
    assert cut.choices[0].message.content == "a b " and cut.choices[0].finish_reason == "length"
    stopped = client.chat.completions.create(model="qwen3:8b", messages=ASK, stop=["STOP"])
    assert stopped.choices[0].message.content == "alpha beta "


def test_errors_reach_the_sdk_as_its_exception_types(client, fake):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-nothing", messages=ASK)
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="qwen3:8b", messages=[])
    with (
        openai.OpenAI(base_url=fake.base_url, api_key="wrong", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.models.list()
    fake.error_after_tokens = 2
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="qwen3:8b", messages=ASK, stream=True))


def test_closing_a_stream_is_seen_by_the_server_as_an_abort(client, fake):
    fake.token_delay_s = 0.02
    fake.replies.append(" ".join(f"w{i}" for i in range(3000)))
    stream = client.chat.completions.create(model="qwen3:8b", messages=ASK, stream=True)
    for n, _ in enumerate(stream):
        if n >= 3:
            break
    stream.close()
    entry = fake.requests[-1]
    wait_for(entry)
    assert entry["aborted"] and not entry["finished"]
