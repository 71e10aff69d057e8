#!/usr/bin/env python3
"""Start, check, stop and read the logs of the local stack: the rag_worker and the gateway (which serves the web).

    python run_system.py                 start both, wait until healthy, print where to chat; Ctrl-C stops both
    python run_system.py --health        table of Ollama, worker and gateway; non-zero exit names what is unhealthy
    python run_system.py --stop          stop exactly the processes a running start launched (from its pid file)
    python run_system.py --logs [-f]     tail logs/worker.log and logs/gateway.log
    python run_system.py --worker-only   only the worker (its HTTP API, for other programs)
    python run_system.py --no-web        worker and gateway API, without serving the web chat

The supervisor itself lives in launcher/ (one module per concern); this file is its command.
"""

from __future__ import annotations

import sys

from launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
