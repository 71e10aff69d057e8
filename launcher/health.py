"""`--health`: a table of Ollama (or the OpenAI-compatible server), worker and gateway; exit 1 names what is
unhealthy."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from launcher.paths import client_host, load_settings, read_pid_file
from launcher.probes import Probe, describe_llm, get_json, worker_auth


@dataclass
class Row:
    component: str
    state: str  # ok | degraded | down | absent | not used | not started
    url: str
    detail: str
    healthy: bool


def health_rows(args: argparse.Namespace) -> list[Row]:
    from rag_worker.preflight import configured_models

    settings = load_settings()
    running = read_pid_file(args.logs_dir) or {}
    urls = {c["name"]: c["url"] for c in running.get("children", [])}
    chost = client_host(args.host)
    worker_url = urls.get("worker") if args.worker_port_given is None else None
    worker_url = worker_url or f"http://{chost}:{args.worker_port}"
    gateway_url = urls.get("gateway") if args.gateway_port_given is None else None
    gateway_url = gateway_url or f"http://{chost}:{args.gateway_port}"
    components = running.get("components") or (["worker"] if args.worker_only else ["worker", "gateway"])
    rows: list[Row] = []

    worker = get_json(worker_url + "/health", headers=worker_auth(settings))
    llm = worker.body.get("llm") or {}
    backend = running.get("llm_backend") or settings.llm_backend
    ollama_host = running.get("ollama") or settings.ollama_host
    models = [m for m in running.get("models") or configured_models(settings) if m]
    rows.append(openai_row(settings) if backend == "openai" else ollama_row(ollama_host, backend, models))
    rows.append(_service_row("worker", worker_url, worker, describe_llm(llm) if worker.body else ""))
    if "gateway" in components:
        gateway = get_json(gateway_url + "/health")
        parts = ", ".join(f"{k}: {_part(v)}" for k, v in gateway.body.items() if k != "status")
        rows.append(_service_row("gateway", gateway_url, gateway, parts))
    else:
        rows.append(Row("gateway", "not started", gateway_url, "started with --worker-only", True))
    return rows


def ollama_row(host: str, backend: str, models: list[str]) -> Row:
    from rag_worker.preflight import probe_ollama

    if backend == "local":
        return Row("ollama", "not used", host, "LLM_BACKEND=local", True)
    # With LLM_BACKEND=auto the worker falls back to the embedded model, so a missing Ollama is a warning.
    needed = backend == "ollama"
    st = probe_ollama(host, models)
    if st.ready:
        return Row("ollama", "ok", st.host, f"models pulled: {', '.join(models)}", True)
    if st.reachable:
        pulls = "; ".join(f"ollama pull {m}" for m in st.missing)
        return Row("ollama", "degraded", st.host, f"missing models: {pulls}", not needed)
    note = "" if needed else " (embedded model answers)"
    return Row("ollama", "down" if needed else "absent", st.host, f"{st.error}{note}", not needed)


def openai_row(settings) -> Row:
    """LLM_BACKEND=openai: the OpenAI-compatible server replaces Ollama, and turns fail without it."""
    from rag_worker.preflight import openai_status

    st = openai_status(settings)
    if not st.reachable:
        return Row("openai", "down", st.base_url or "(OPENAI_BASE_URL unset)", st.error or "no answer", False)
    if settings.generation_model in st.missing:
        served = ", ".join(st.available) or "nothing"
        return Row(
            "openai",
            "degraded",
            st.base_url,
            f"does not serve {settings.generation_model} (serves: {served})",
            False,
        )
    note = f"; {', '.join(st.missing)} missing, the generation model stands in" if st.missing else ""
    return Row("openai", "ok", st.base_url, f"serves {settings.generation_model}{note}", True)


def _part(value) -> str:
    if isinstance(value, dict):
        return str(value.get("status") or value.get("ok") or json.dumps(value))
    return str(value)


def _service_row(name: str, url: str, probe: Probe, detail: str) -> Row:
    if probe.status is None:
        return Row(name, "down", url, probe.error or "no answer", False)
    if probe.status == 200:
        return Row(name, "ok", url, detail, True)
    reason = detail or probe.error or f"HTTP {probe.status}"
    return Row(name, probe.body.get("status") or f"HTTP {probe.status}", url, reason, False)


def cmd_health(args: argparse.Namespace) -> int:
    rows = health_rows(args)
    widths = [
        max(len(r.component) for r in rows),
        max(len(r.state) for r in rows),
        max(len(r.url) for r in rows),
    ]
    widths = [max(w, len(h)) for w, h in zip(widths, ("component", "state", "url"), strict=True)]
    print(f"{'component':<{widths[0]}}  {'state':<{widths[1]}}  {'url':<{widths[2]}}  detail")
    for r in rows:
        print(f"{r.component:<{widths[0]}}  {r.state:<{widths[1]}}  {r.url:<{widths[2]}}  {r.detail}")
    bad = [r.component for r in rows if not r.healthy]
    if bad:
        print(f"\nunhealthy: {', '.join(bad)}")
        return 1
    print("\nall healthy")
    return 0
