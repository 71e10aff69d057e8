"""The worker's contract (WORKER_API.md), machine-readable, built from the same pydantic models the routes use."""

from __future__ import annotations

from functools import cache

from . import __version__
from .schemas import ChatRequest, Document, TitleRequest

ERROR = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}, "field": {"type": "string"}},
}
ANSWER = {
    "type": "object",
    "required": [
        "reply",
        "question",
        "history",
        "documents",
        "fetched_new_documents",
        "route",
        "citations",
        "abstained",
        "model",
        "timings",
    ],
    "properties": {
        "reply": {"type": "string"},
        "question": {"type": "string"},
        "rewritten": {"type": ["string", "null"]},
        "history": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
        "documents": {"type": "array", "items": {"$ref": "#/components/schemas/Document"}},
        "fetched_new_documents": {"type": "boolean"},
        "route": {"enum": ["rag", "direct", "sql"]},
        "citations": {"type": "array", "items": {"type": "object"}},
        "abstained": {"type": "boolean"},
        "model": {"type": "string"},
        "flags": {"type": "object"},
        "grounding": {
            "type": ["object", "null"],
            "description": "each answer sentence checked against the passages the model read (null: no sources)",
            "properties": {
                "supported_share": {"type": "number", "minimum": 0, "maximum": 1},
                "supported": {"type": "integer"},
                "checked": {"type": "integer"},
                "policy": {"enum": ["flag", "extract", "refuse"]},
                "answer_mode": {"enum": ["generated", "extractive"]},
                "action": {"enum": ["none", "flagged", "extracted", "refused"]},
                "draft": {"type": "object"},
                "sentences": {"type": "array", "items": {"type": "object"}},
            },
        },
        "timings": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}


ADDED = {
    "type": "object",
    "required": ["filename", "dataset", "document_id", "chunks", "replaced"],
    "properties": {
        "filename": {"type": "string"},
        "dataset": {"type": "string"},
        "document_id": {"type": "string", "description": "sha256 of the file's bytes"},
        "chunks": {"type": "integer"},
        "replaced": {"type": "boolean", "description": "an older file of the same name was replaced"},
        "unchanged": {"type": "boolean", "description": "identical bytes were already indexed: nothing done"},
    },
}
FILE_INFO = {
    "type": "object",
    "properties": {
        "filename": {"type": "string"},
        "dataset": {"type": "string"},
        "document_id": {"type": "string"},
        "chunks": {"type": "integer"},
        "bytes": {"type": "integer"},
        "indexed_at": {"type": "string", "format": "date-time"},
    },
}
STEP = {
    "type": "object",
    "required": ["step", "label", "elapsed_ms"],
    "properties": {
        "step": {"type": "string"},
        "label": {"type": "string"},
        "elapsed_ms": {"type": "integer"},
        "method": {
            "type": "string",
            "description": "which path decided: retrieval_score, similarity, llm, ...",
        },
        "detail": {"type": "object"},
    },
}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": "error", **_json({"$ref": "#/components/schemas/Error"})} for c in codes}


@cache
def spec() -> dict:
    chat_schema = ChatRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = dict(chat_schema.pop("$defs", {}))
    components.update(
        {
            "ChatRequest": chat_schema,
            "Error": ERROR,
            "Answer": ANSWER,
            "Document": Document.model_json_schema(),
            "TitleRequest": TitleRequest.model_json_schema(),
            "Added": ADDED,
            "FileInfo": FILE_INFO,
            "Step": STEP,
        }
    )
    chat_body = {"required": True, **_json({"$ref": "#/components/schemas/ChatRequest"})}
    sse = {
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "string",
                    "description": "events: step (Step), documents, token, done (the Answer), error (Error); "
                    "': keepalive' comments at least every 15 s. /index sends progress {file, dataset, done, total, stage} "
                    "then done {documents, chunks, seconds, unchanged, failed} or error",
                }
            }
        }
    }
    index_q = {"name": "index", "in": "query", "required": True, "schema": {"type": "string"}}
    paths = {
        "/chat": {
            "post": {
                "summary": "One chat turn, answered as JSON",
                "requestBody": chat_body,
                "responses": {
                    "200": {"description": "the answer", **_json({"$ref": "#/components/schemas/Answer"})},
                    **_errors(400, 401, 404, 409, 413, 503),
                },
            }
        },
        "/chat_stream": {
            "post": {
                "summary": "One chat turn, streamed as Server-Sent Events",
                "requestBody": chat_body,
                "responses": {
                    "200": {"description": "the event stream", **sse},
                    **_errors(400, 401, 404, 409, 413),
                },
            }
        },
        "/create_title": {
            "post": {
                "summary": "A short title for a chat",
                "requestBody": {"required": True, **_json({"$ref": "#/components/schemas/TitleRequest"})},
                "responses": {
                    "200": {
                        "description": "the title",
                        **_json({"type": "object", "properties": {"title": {"type": "string"}}}),
                    },
                    **_errors(400, 401),
                },
            }
        },
        "/add_document": {
            "post": {
                "summary": "Upload and index one file (multipart: file, dataset, index)",
                "responses": {
                    "200": {
                        "description": "the indexed file",
                        **_json({"$ref": "#/components/schemas/Added"}),
                    },
                    **_errors(400, 401, 409, 413, 415),
                },
            }
        },
        "/get_documents": {
            "get": {
                "summary": "Files of an index",
                "parameters": [index_q],
                "responses": {
                    "200": {
                        "description": "the files",
                        **_json({"type": "array", "items": {"$ref": "#/components/schemas/FileInfo"}}),
                    },
                    **_errors(400, 404),
                },
            }
        },
        "/get_datasets": {
            "get": {
                "summary": "Dataset names of an index",
                "parameters": [index_q],
                "responses": {"200": {"description": "the names"}, **_errors(400, 404)},
            }
        },
        "/get_document": {
            "get": {
                "summary": "Download an original file",
                "parameters": [
                    index_q,
                    {"name": "dataset", "in": "query", "required": True, "schema": {"type": "string"}},
                    {"name": "filename", "in": "query", "required": True, "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "the file"}, **_errors(400, 404)},
            }
        },
        "/delete": {
            "post": {
                "summary": "Remove one file: its rows, vectors and full-text entries",
                "responses": {"200": {"description": "{count}"}, **_errors(400, 404)},
            }
        },
        "/index": {
            "post": {
                "summary": "(Re)build an index from shared_uploads/<index>/, streamed progress",
                "responses": {"200": {"description": "progress events", **sse}, **_errors(400, 409)},
            }
        },
        "/indexes/{index}": {
            "delete": {
                "summary": "Drop an index and its overviews",
                "responses": {"200": {"description": "dropped"}, **_errors(400, 404)},
            }
        },
        "/config": {
            "get": {
                "summary": "Effective defaults, secrets redacted",
                "responses": {"200": {"description": "config"}},
            }
        },
        "/health": {
            "get": {
                "summary": "Readiness of the LLM, embedder and store",
                "responses": {"200": {"description": "ok"}, "503": {"description": "degraded"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rag_worker",
            "version": __version__,
            "description": "Stateless RAG worker: every call carries the conversation; see WORKER_API.md",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
