"""Operational routes: `/health`, `/config`, `/openapi.json`."""

from __future__ import annotations

import logging

from flask import current_app, jsonify

from .. import __version__
from ..openapi import json_content, spec
from ..pipeline.prompts import DEFAULTS
from ..responses import Config, Health
from ..schemas import option_defaults
from ..security import mask_credentials
from . import has_valid_key, services
from .table import Routes

routes = Routes("meta", __name__)
OPERATIONS = "operations"  # app.extensions key: every route's Operation, in registration order
log = logging.getLogger("rag_worker")


def converters_health(settings) -> dict:
    """OCR (Tesseract) and office conversion (LibreOffice) availability: informational, never a 503."""
    from ..ingest import mail_office, ocr

    try:
        state = ocr.status(ocr.ocr_options(settings))
    except Exception as exc:  # a broken tesseract install is reported, not raised
        state = {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}
    state["office"] = mail_office.office_available()
    return state


@routes.get(
    "/health",
    "Readiness of the LLM, embedder and store (503 when not ready)",
    answer=Health,
    errors=(503,),
    open=True,
)
def health():
    """Open to all, so probes need no key; but with a key set, only callers that send it see the details."""
    body, status = _health()
    if not has_valid_key():
        body = {"status": body["status"]}
    return jsonify(mask_credentials(body)), status


def _health() -> tuple[dict, int]:
    svc = services()
    body: dict = {"status": "ok", "version": __version__}
    try:
        body["llm"] = svc.llm.health()
        llm_ok = bool(body["llm"].get("ok", True))
    except Exception as exc:
        body["llm"] = {"ok": False, "error": str(exc)}
        llm_ok = False
    body["embedder"] = svc.embedder_health()
    try:
        indexes = svc.store.indexes()
        body["store"] = {"ok": True, "path": str(svc.settings.lancedb_dir), "indexes": len(indexes)}
    except Exception as exc:
        body["store"] = {"ok": False, "error": str(exc)}
    body["reranker"] = (
        svc.reranking.health()
        if svc.settings.reranker_model
        else {
            "model": None,
            "note": f"no reranker configured: ordering relies on hybrid fusion ({svc.settings.fusion})",
        }
    )
    body["ocr"] = converters_health(svc.settings)
    down = [k for k in ("embedder", "store") if not body[k].get("ok")]
    if down:
        body["status"] = "down"
        body["down"] = down
        return body, 503
    if not llm_ok:
        body["status"] = "degraded"
        return body, 503
    if body["reranker"].get("ok") is False:  # turns still answer, in the fusion's order: ready, but worse
        body["status"] = "degraded"
        body["degraded"] = ["reranker"]
    return body, 200


@routes.get("/config", "Effective defaults, secrets redacted", answer=Config, errors=())
def config():
    svc = services()
    s = svc.settings
    return jsonify(
        {
            "settings": s.public_dict(),
            "defaults": option_defaults(s),
            "prompts": DEFAULTS,
            "reranker": s.reranker_model or None,
        }
    )


@routes.get("/openapi.json", "This document", answer=json_content({"type": "object"}), errors=())
def openapi():
    operations = current_app.extensions[OPERATIONS]
    return jsonify(spec(operations, auth_required=services().settings.worker_api_key is not None))


METRICS_CONTENT = {"text/plain": {"schema": {"type": "string", "description": "Prometheus text exposition"}}}


def metrics_allowed() -> bool:
    """/metrics: to a client on this machine (not through a proxy), or to one sending the worker's key."""
    from flask import request

    from contract.observe import is_loopback_client

    forwarded = bool(request.headers.get("X-Forwarded-For") or request.headers.get("Forwarded"))
    if is_loopback_client(request.remote_addr, forwarded):
        return True
    return services().settings.worker_api_key is not None and has_valid_key()


@routes.get(
    "/metrics",
    "Prometheus metrics (to loopback clients, or with the key; another caller gets 404 when no key is set)",
    answer=METRICS_CONTENT,
    errors=(404,),
    key_optional=True,
)
def metrics():
    from flask import Response

    from contract.metrics import ENABLED, render

    from ..errors import NotFound

    if not ENABLED or not metrics_allowed():  # METRICS=off: as if there were no such route
        raise NotFound("no such route: /metrics", code="not_found")
    body, content_type = render()
    return Response(body, content_type=content_type)
