"""Turn defaults (admin) and health."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from . import audit
from .context import admin_user, ctx, current_user, in_thread, read_json
from .db import SettingRow, utcnow
from .errors import ApiError
from .policy import Policy, choosable_models, configured_models, load_policy, store_policy
from .quotas import check_options
from .responses import Health, SettingsOut
from .routing import ApiRoute, Operation
from .schemas import SettingsUpdate
from .turns.plan import TURN_OPTIONS_KEY, default_options


async def get_settings(request: Request) -> JSONResponse:
    """The turn defaults, the models a turn may name and the prompt presets' names, for everyone; the presets'
    prompts and the worker's configuration (models, hosts, prompts) for admins only."""
    user = await current_user(request)
    c = ctx(request)

    def load() -> tuple[dict, Policy]:
        with c.db.session() as s:
            return default_options(s), load_policy(s)

    options, policy = await in_thread(load)
    try:
        worker_defaults = await c.worker.config()
    except ApiError:
        worker_defaults = None
    return JSONResponse(
        SettingsOut(
            options=options,
            worker_defaults=worker_defaults if user.is_admin else None,
            allowed_models=policy.allowed_models,
            models=choosable_models(policy, options, configured_models(worker_defaults)),
            presets=sorted(policy.prompt_presets),
            prompt_presets=policy.prompt_presets if user.is_admin else None,
        ).data()
    )


async def put_settings(request: Request) -> JSONResponse:
    admin = await admin_user(request)
    address = audit.address_of(request)
    c = ctx(request)
    body = await read_json(request, SettingsUpdate)
    check_options(body.options, c.settings)

    def store() -> tuple[dict, Policy]:
        with c.db.session() as s:
            if body.options is not None:
                row = s.get(SettingRow, TURN_OPTIONS_KEY) or SettingRow(key=TURN_OPTIONS_KEY)
                row.value = body.options.as_options()
                row.updated_at = utcnow()
                s.add(row)
            policy = load_policy(s)
            if body.allowed_models is not None:
                policy.allowed_models = list(dict.fromkeys(body.allowed_models))
            if body.prompt_presets is not None:
                policy.prompt_presets = body.prompt_presets
            store_policy(s, policy)
            changed = sorted(body.model_fields_set & {"options", "allowed_models", "prompt_presets"})
            audit.record(
                s, admin, "settings.update", "settings", "turn_defaults", {"fields": changed}, address
            )
            s.commit()
            return default_options(s), policy

    options, policy = await in_thread(store)
    return JSONResponse(
        SettingsOut(
            options=options,
            allowed_models=policy.allowed_models,
            presets=sorted(policy.prompt_presets),
            prompt_presets=policy.prompt_presets,
        ).data()
    )


def _llm_state(worker_health: dict) -> str:
    """The worker's view of its LLM (Ollama, an OpenAI-compatible server or the embedded model): "ok" or
    "down"; "unknown" when the worker does not show its details (a WORKER_API_KEY the gateway lacks)."""
    llm = worker_health.get("llm")
    if isinstance(llm, dict):
        if "ok" in llm:
            return "ok" if llm["ok"] else "down"
        status = str(llm.get("status", "")).lower()
        return "ok" if status in ("ok", "up", "ready", "available") else "down"
    if isinstance(llm, str):
        return "ok" if llm.lower() in ("ok", "up", "ready") else "down"
    return "unknown"


def llm_report(worker_health: dict) -> dict:
    """The LLM part of the gateway's health, named by the backend the worker really uses (its /health `llm`:
    "ollama", "openai" or "local", the embedded model), with the model that answers."""
    llm = worker_health.get("llm")
    backend, model = "unknown", None
    if isinstance(llm, dict):
        backend = str(llm.get("backend") or "unknown")
        model = llm.get("generation_model") or llm.get("model")
    report = {"llm": _llm_state(worker_health), "llm_backend": backend, "llm_model": model}
    if backend == "ollama":
        report["ollama"] = report["llm"]  # the name this part had before other backends existed
    return report


async def health(request: Request) -> JSONResponse:
    c = ctx(request)
    report: dict = {
        "status": "ok",
        "database": "ok",
        "worker": "ok",
        "llm": "unknown",
        "llm_backend": "unknown",
    }
    try:
        await in_thread(c.db.ping)
    except Exception as exc:
        report["database"] = "down"
        report["database_error"] = type(exc).__name__
    try:
        code, body = await c.worker.health()
        report.update(llm_report(body))
        report["worker_status"] = body.get("status")
        if code >= 500 and report["llm"] == "ok":
            report["worker"] = "degraded"  # up, but something other than the LLM is failing
    except ApiError as exc:
        report["worker"] = "down"
        report["worker_error"] = exc.message
    # Ollama seen from here too (the gateway's OLLAMA_HOST), only when the worker says it uses Ollama (or says
    # nothing): with an OpenAI-compatible server or the embedded model, no Ollama is needed.
    if c.settings.ollama_host and report["llm_backend"] in ("ollama", "unknown"):
        state = "ok" if await c.worker.ollama_reachable(c.settings.ollama_host) else "down"
        report["ollama"] = state
        if report["llm_backend"] == "ollama" or state == "down":
            report["llm"] = state
    down = [part for part in ("database", "worker", "llm") if report[part] in ("down", "degraded")]
    if down:
        # The LLM named by its backend: "openai" down sends the operator to the right server.
        named = [
            report["llm_backend"] if p == "llm" and report["llm_backend"] != "unknown" else p for p in down
        ]
        report["status"] = "down"
        report["down"] = named
        report["error"] = "not working: " + ", ".join(named)
    return JSONResponse(
        Health(**report).model_dump(mode="json", exclude_unset=True), status_code=503 if down else 200
    )


routes = [
    ApiRoute(
        "GET",
        "/api/settings",
        get_settings,
        Operation(
            "The turn defaults, the models a turn may name, the prompt presets; the worker's configuration and "
            "the presets' prompts too for administrators",
            answer=SettingsOut,
            tag="settings",
        ),
    ),
    ApiRoute(
        "PUT",
        "/api/settings",
        put_settings,
        Operation(
            "Set the turn defaults, the allowed models and the prompt presets (administrators); a field left "
            "out keeps its value",
            SettingsUpdate,
            SettingsOut,
            errors=(403,),
            tag="settings",
        ),
    ),
    ApiRoute(
        "GET",
        "/health",
        health,
        Operation(
            "Database, worker and the LLM named by its backend; 503 naming the failing part",
            answer=Health,
            public=True,
            tag="operations",
        ),
    ),
]
