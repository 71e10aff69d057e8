#!/usr/bin/env python3
"""Start, check, stop and read the logs of the local stack (the rag_worker and the gateway, which serves the web).

The command only: the supervisor is the `launcher/` package, one module per concern; `python run_system.py
--help` lists the options (launcher/cli.py).
"""

from __future__ import annotations

import sys

from launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
