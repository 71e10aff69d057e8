"""Concurrent query embeddings share one forward pass under gevent (as in the worker), each getting its own row."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from gevent import monkey

    monkey.patch_all()
    import gevent
    import numpy as np

    from rag_worker.embeddings import QueryBatcher

    calls = []

    def forward(texts):
        calls.append(list(texts))
        return np.array([[float(len(t)), float(i)] for i, t in enumerate(texts)], dtype=np.float32)

    batcher = QueryBatcher(forward, True, max_batch=8)
    assert batcher.embed("alone")[0] == 5.0 and calls == [["alone"]]  # a lone query runs at once
    calls.clear()
    texts = [f"query {'x' * i}" for i in range(13)]
    jobs = [gevent.spawn(batcher.embed, t) for t in texts]
    gevent.joinall(jobs, raise_error=True)
    # 13 queries at once: the first finds the model idle and runs alone; the 12 that queued meanwhile share
    # two passes (8 + 4), not 12; each caller got the row of its own text.
    assert [len(c) for c in calls] == [1, 8, 4], calls
    assert [j.value[0] for j in jobs] == [float(len(t)) for t in texts]

    # An answer's few sentences (embed_many) ride the same passes as concurrent turns' texts, each in its row.
    calls.clear()
    answers = [[f"answer {i} sentence {'y' * k}" for k in range(3)] for i in range(4)]
    jobs = [gevent.spawn(batcher.embed_many, a) for a in answers]
    gevent.joinall(jobs, raise_error=True)
    assert [len(c) for c in calls] == [3, 8, 1], calls  # 12 sentences in 3 passes, not 4
    assert [list(j.value[:, 0]) for j in jobs] == [[float(len(t)) for t in a] for a in answers]

    def broken(texts):
        raise RuntimeError("model gone")

    failing = QueryBatcher(broken, True, max_batch=8)
    jobs = [gevent.spawn(failing.embed, "q") for _ in range(3)]
    gevent.joinall(jobs)
    assert all(isinstance(j.exception, RuntimeError) for j in jobs)  # every waiter hears of it, none hangs

    # In a native thread (gevent's pool) or with no window, a query runs alone, as before.
    alone = QueryBatcher(forward, False, max_batch=8)
    calls.clear()
    alone.embed("solo")
    gevent.get_hub().threadpool.apply(batcher.embed, ("from a thread",))
    assert calls == [["solo"], ["from a thread"]], calls
    print("ok")
    """
)


def test_concurrent_queries_share_a_forward_pass_under_gevent():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
