"""`python -m rag_worker.sandbox <config>`: the helper process a `Sandbox` starts."""

import sys

from .helper import main

sys.exit(main(sys.argv[1:]))
