"""`POST /chat` (one JSON answer) and `POST /chat_stream` (SSE): the same pipeline, two transports."""

from __future__ import annotations

from flask import jsonify

from contract.answer import Answer

from .. import metrics
from ..errors import ApiError
from ..openapi import sse
from ..pipeline.chat import prepare, run_turn
from ..pipeline.events import Done, Error
from ..pipeline.turn import Turn
from ..responses import Title
from ..schemas import ChatRequest, TitleRequest, check_chat_limits, parse
from ..sse import frame, sse_response
from . import json_body, services
from .table import Routes

routes = Routes("chat", __name__)

CHAT_EVENTS = sse(
    "step (Step), documents {documents: [Document]}, token {token}, done (Answer) or error (ErrorBody); "
    "': keepalive' comments at least every 15 s",
    ["step", "documents", "token", "done", "error"],
)
# 503 code "busy" (with Retry-After) when MAX_QUEUED_TURNS turns already wait.
CHAT_ERRORS = (400, 404, 409, 413, 503)


def start_turn(req: ChatRequest) -> Turn:
    """Everything a turn may be refused for before its first byte, on every chat route: the size limits, an
    unknown index or embedder (prepare), and a full queue (503 with Retry-After)."""
    svc = services()
    check_chat_limits(req, svc.settings)
    turn = prepare(svc, req)
    if (
        turn.options.route != "direct"
    ):  # a turn that may retrieve may wait in the queue: refuse when it's full
        try:
            svc.turn_queue.admit()
        except ApiError:
            metrics.turn_refused(turn.options.route)
            raise
    return turn


def load_turn() -> Turn:
    return start_turn(parse(ChatRequest, json_body()))


@routes.post("/chat", "One chat turn, answered as JSON", body=ChatRequest, answer=Answer, errors=CHAT_ERRORS)
def chat():
    turn = load_turn()
    answer = None
    for event in run_turn(turn):
        if isinstance(event, Error):
            raise ApiError(event.error, code=event.code, status=event.status if event.status >= 400 else 500)
        if isinstance(event, Done):
            answer = event.data
    return jsonify(answer)


@routes.post(
    "/chat_stream",
    "One chat turn, streamed as Server-Sent Events",
    body=ChatRequest,
    answer=CHAT_EVENTS,
    errors=CHAT_ERRORS,
)
def chat_stream():
    turn = load_turn()  # 4xx before the stream starts: a client gets a JSON error, not a broken stream

    def frames():
        for event in run_turn(turn):
            yield frame(event.name, event.data)

    return sse_response(frames(), services().settings.keepalive_s)


@routes.post("/create_title", "A short title for a chat", body=TitleRequest, answer=Title, errors=(400, 503))
def create_title():
    from ..pipeline.titles import make_title

    req = parse(TitleRequest, json_body())
    return jsonify({"title": make_title(services(), req.question)})
