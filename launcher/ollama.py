"""Before starting: is Ollama (or the OpenAI-compatible server) there, are the configured models served."""

from __future__ import annotations


def report_ollama(settings) -> None:
    """Before starting: is Ollama there, are the configured models pulled, and how to fix it if not."""
    from rag_worker.preflight import advice, configured_models, probe_ollama

    if settings.llm_backend == "local":
        print(f"LLM:     LLM_BACKEND=local: {embedded_line(settings)}; Ollama is not used", flush=True)
        return
    if settings.llm_backend == "openai":
        from rag_worker.preflight import openai_status

        st = openai_status(settings)
        if st.ready:
            print(f"OpenAI:  {st.base_url} serves {', '.join(configured_models(settings))}", flush=True)
        elif st.reachable:
            print(f"OpenAI:  {st.base_url} does not serve {', '.join(st.missing)}", flush=True)
            print(f"         it serves: {', '.join(st.available) or 'nothing'}", flush=True)
        else:
            print(
                f"OpenAI:  not reachable at {st.base_url or '(OPENAI_BASE_URL unset)'} ({st.error})",
                flush=True,
            )
        return
    models = configured_models(settings)
    status = probe_ollama(settings.ollama_host, models)
    if status.ready:
        print(f"Ollama:  {status.host} has {', '.join(models)}", flush=True)
        return
    if status.reachable:
        print(f"Ollama:  {status.host} is up but missing {', '.join(status.missing)}", flush=True)
    else:
        print(f"Ollama:  not reachable at {status.host} ({status.error})", flush=True)
    for tip in advice(status, settings.llm_backend, container=False):
        print(f"         {tip}", flush=True)
    if settings.llm_backend == "auto":
        print(f"LLM:     until then {embedded_line(settings)}", flush=True)


def embedded_line(settings) -> str:
    """Which embedded model answers and why: EMBEDDED_MODEL, LOCAL_MODEL, or the fallback and what to install."""
    from rag_worker.llm.embedded import choose

    choice = choose(settings)
    if choice.fallback:
        return f"the embedded model {choice.name} answers ({choice.reason}: {choice.fallback})"
    return f"the embedded model {choice.name} answers ({choice.reason}, llama.cpp in-process)"
