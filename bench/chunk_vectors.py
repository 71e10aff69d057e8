"""Would one forward pass do for both the chunk's vector and its sentences' exact vectors? Dense retrieval on
SciFact test with the chunk vectors made two ways (issue 31, item 1).

    .venv/bin/python -m bench.chunk_vectors [--split test]

- full attention: what ingestion embeds today (the chunk's text, every token attending to every other).
- sentence-isolated mean: the same tokens, each sentence attending only to itself (its own [CLS] ... [SEP] and
  positions), the chunk's vector the mean of all its tokens' last hidden states. One pass of that kind gives each
  sentence exactly the vector the grounding check embeds it with (the issue's "sentence vectors at ingestion")
  for the cost of the chunk's own forward pass, so ingestion would keep its throughput; the price would be the
  chunk vectors this measures. Here each sentence runs on its own (the same arithmetic as a packed pass with a
  block-diagonal mask), which is slower but measures the same vectors.

Each SciFact abstract (title, blank line, text) is one chunk, cut at the embedder's 256 tokens either way (whole
sentences for the isolated pass). Vector search only (no full-text leg, no fusion), exact cosine over the corpus.
Prints nDCG@10 and Recall@100 for each; never pass/fail. Vectors are cached under .cache/bench/chunk_vectors/.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench import beir

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT.parent / "shared" / "eval" / "scifact"
CACHE = ROOT / ".cache" / "bench" / "chunk_vectors"


def isolated_mean(embedder, text: str) -> np.ndarray:
    """The mean of `text`'s tokens' last hidden states, each sentence run on its own, L2-normalised."""
    import torch

    from rag_worker.store.rows import chunk_sentences

    kept, n = [], 0
    for sentence in chunk_sentences(text):
        k = embedder.count_tokens(sentence) + 2
        if kept and n + k > embedder.max_length:
            break
        kept.append(sentence)
        n += k
    enc = embedder._tok(
        kept, padding=True, truncation=True, max_length=embedder.max_length, return_tensors="pt"
    )
    with torch.inference_mode():
        hidden = embedder._model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum((0, 1)) / mask.sum()
    return torch.nn.functional.normalize(mean, dim=0).numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test", choices=("test", "train"))
    args = parser.parse_args(argv)
    if not (SCIFACT / "corpus.jsonl").is_file():
        print(f"SciFact not found at {SCIFACT} (the shared eval folder)", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import Settings

    embedder = Embedder(Settings().resolved_embedding_model())
    data = beir.load(SCIFACT, args.split)
    ids = list(data.corpus)
    texts = [f"{data.corpus[d]['title']}\n\n{data.corpus[d]['text']}" for d in ids]
    print(f"load average {os.getloadavg()[0]:.1f}; {len(texts)} abstracts", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    cache = CACHE / f"vectors-{len(texts)}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            full, isolated = z["full"], z["isolated"]
    else:
        started = time.monotonic()
        full = embedder.embed_documents(texts)
        print(f"full attention: {time.monotonic() - started:.0f} s", flush=True)
        started = time.monotonic()
        isolated = np.stack([isolated_mean(embedder, t) for t in texts])
        print(f"sentence-isolated (one sentence at a time): {time.monotonic() - started:.0f} s", flush=True)
        np.savez(cache, full=full, isolated=isolated)
    qids = [q for q in data.qrels if q in data.queries]
    queries = np.stack([embedder.embed_query(data.queries[q]) for q in qids])
    print("\n| chunk vector | nDCG@10 | Recall@100 |\n|---|---:|---:|")
    for name, matrix in (("full attention (today)", full), ("sentence-isolated mean", isolated)):
        scores = queries @ matrix.T
        ndcg, recall = [], []
        for i, q in enumerate(qids):
            top = [ids[j] for j in np.argsort(-scores[i])[:100]]
            ndcg.append(beir.ndcg_at(top, data.qrels[q], 10))
            recall.append(beir.recall_at(top, data.qrels[q], 100))
        print(f"| {name} | {np.mean(ndcg):.4f} | {np.mean(recall):.4f} |")
    print(f"\n{len(qids)} queries, {len(ids)} abstracts, vector search only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
