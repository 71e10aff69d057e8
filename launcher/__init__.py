"""The local stack's supervisor behind `python run_system.py`: start, check, stop and read the logs of the
rag_worker and the gateway. One module per concern:

    paths      the project folder, the pid file, settings and ports
    processes  child processes in their own process groups, and stopping a group for sure
    probes     HTTP /health probes and the one-line description of the LLM in use
    ollama     the pre-start report on Ollama or the OpenAI-compatible server
    demo       the `demo` index built from README.md and docs/ on a first start
    start      the start command and the supervisor that watches the children
    stop       --stop
    health     --health
    logs       --logs
    cli        the command line
"""
