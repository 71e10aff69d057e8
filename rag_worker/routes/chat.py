"""`POST /chat` (one JSON answer) and `POST /chat_stream` (SSE): the same pipeline, two transports."""

from __future__ import annotations

from flask import Blueprint, jsonify

from ..errors import ApiError
from ..pipeline.chat import prepare, run_turn
from ..pipeline.events import Done, Error
from ..schemas import ChatRequest, check_chat_limits, parse
from ..sse import frame, sse_response
from . import json_body, services

bp = Blueprint("chat", __name__)


def load_turn():
    svc = services()
    req = parse(ChatRequest, json_body())
    check_chat_limits(req, svc.settings)
    turn = prepare(svc, req)
    if (
        turn.options.route != "direct"
    ):  # a turn that may retrieve may wait in the queue: refuse when it's full
        svc.turn_queue.admit()
    return turn


@bp.post("/chat")
def chat():
    turn = load_turn()
    answer = None
    for event in run_turn(turn):
        if isinstance(event, Error):
            raise ApiError(event.error, code=event.code, status=event.status if event.status >= 400 else 500)
        if isinstance(event, Done):
            answer = event.answer
    return jsonify(answer)


@bp.post("/chat_stream")
def chat_stream():
    turn = load_turn()  # 4xx before the stream starts: a client gets a JSON error, not a broken stream

    def frames():
        for event in run_turn(turn):
            yield frame(event.name, event.data)

    return sse_response(frames(), services().settings.keepalive_s)


@bp.post("/create_title")
def create_title():
    from ..pipeline.titles import make_title
    from ..schemas import TitleRequest

    req = parse(TitleRequest, json_body())
    return jsonify({"title": make_title(services(), req.question)})
