"""OpenAI-compatible routes: `GET /v1/models` and `POST /v1/chat/completions` (openai_compat.py translates)."""

from __future__ import annotations

import time

from flask import jsonify

from ..openai_compat import (
    ChatCompletionRequest,
    chunks,
    completion,
    index_of,
    model_card,
    model_ids,
    to_chat_request,
)
from ..openapi import path_param, sse
from ..pipeline.chat import run_turn
from ..responses import ChatCompletion, ModelCard, ModelList, OpenAIError
from ..schemas import parse
from ..sse import sse_response
from . import json_body, services
from .chat import start_turn
from .table import Routes

routes = Routes("v1", __name__, url_prefix="/v1")
COMPLETION_CHUNKS = sse("chat.completion.chunk objects, the last one carrying `rag` (Answer), then [DONE]")


@routes.get(
    "/models",
    "OpenAI model list: `direct` and `rag/<index>` per index",
    answer=ModelList,
    errors=(),
    error=OpenAIError,
)
def list_models():
    now = int(time.time())
    return jsonify({"object": "list", "data": [model_card(m, now) for m in model_ids(services())]})


@routes.get(
    "/models/<path:model>",
    "One OpenAI model",
    answer=ModelCard,
    error=OpenAIError,
    errors=(404,),
    params=(path_param("model", {"type": "string"}),),
)
def get_model(model: str):
    index_of(services(), model)  # 404 for a model that does not exist
    return jsonify(model_card(model, int(time.time())))


@routes.post(
    "/chat/completions",
    "OpenAI chat completion over an index (`stream: true`: chunks)",
    body=ChatCompletionRequest,
    answer=ChatCompletion,
    also=COMPLETION_CHUNKS,
    error=OpenAIError,
    errors=(400, 404, 409, 413, 503),
)
def chat_completions():
    svc = services()
    req = parse(ChatCompletionRequest, json_body())
    turn = start_turn(to_chat_request(svc, req))  # 4xx and 503 before the stream starts, in OpenAI's shape
    if req.stream:
        return sse_response(chunks(req.model, run_turn(turn)), svc.settings.keepalive_s)
    return jsonify(completion(req.model, run_turn(turn)))
