"""rag_worker: the stateless RAG service (retrieval, generation, ingestion)."""

import os

__version__ = "0.1.0"

# OpenMP threads that wait for work by sleeping, not spinning. Set before torch loads libgomp (it reads the variable
# once, then). With the default spin-wait, torch's threads burn the CPUs they wait on: on a busy 2-core machine
# (other processes, or the embedder and the embedded model computing at once in one worker) a 14-sentence
# embedding took 2.6-3.8 s instead of 0.4 s, and the embedded model decoded at 0.3 tokens/s instead of 3
# (docs/benchmarks.md, "The README's demo question"). An operator's own OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
