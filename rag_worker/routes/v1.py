"""OpenAI-compatible routes: `GET /v1/models` and `POST /v1/chat/completions` (openai_compat.py translates)."""

from __future__ import annotations

import time

from flask import Blueprint, jsonify

from ..openai_compat import (
    ChatCompletionRequest,
    chunks,
    completion,
    index_of,
    model_card,
    model_ids,
    to_chat_request,
)
from ..pipeline.chat import prepare, run_turn
from ..schemas import check_chat_limits, parse
from ..sse import sse_response
from . import json_body, services

bp = Blueprint("v1", __name__, url_prefix="/v1")


@bp.get("/models")
def list_models():
    now = int(time.time())
    return jsonify({"object": "list", "data": [model_card(m, now) for m in model_ids(services())]})


@bp.get("/models/<path:model>")
def get_model(model: str):
    index_of(services(), model)  # 404 for a model that does not exist
    return jsonify(model_card(model, int(time.time())))


@bp.post("/chat/completions")
def chat_completions():
    svc = services()
    req = parse(ChatCompletionRequest, json_body())
    chat_request = to_chat_request(svc, req)
    check_chat_limits(chat_request, svc.settings)
    turn = prepare(svc, chat_request)  # 4xx before the stream starts, as JSON in OpenAI's shape
    if req.stream:
        return sse_response(chunks(req.model, run_turn(turn)), svc.settings.keepalive_s)
    return jsonify(completion(req.model, run_turn(turn)))
