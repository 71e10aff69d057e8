"""How hybrid mode fuses its two legs' rows into one ranking (docs/benchmarks.md, "Fusion").

- "rrf": reciprocal rank fusion, score = sum over legs of 1 / (rrf_k + rank);
- "tmm": a convex combination of scores normalised by theoretical min-max (Bruch, Gai, Ingber 2023, "An Analysis
  of Fusion Functions for Hybrid Retrieval"): alpha * (cos - (-1)) / (max cos - (-1)) + (1 - alpha) * bm25 / max
  bm25, each max taken over that leg's candidates;
- "zscore": the same convex combination of z-scores, mean and deviation taken over each leg's candidates;
- "robust": the same with robust z-scores, (score - median) / (1.4826 * median absolute deviation) over each
  leg's candidates (1.4826 makes the MAD equal the standard deviation of normally distributed scores). A leg's
  top 100 is a few relevant outliers above a mass of near misses; the mean and deviation move with those outliers,
  so one very strong match squeezes every other candidate of its leg, while the median and MAD describe the mass
  and leave the outliers standing out (docs/benchmarks.md, "Seventh round").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..settings import Settings
from .rows import Hit, to_hit

FUSIONS = ("rrf", "tmm", "zscore", "robust")
# The MAD of normally distributed values times this is their standard deviation.
MAD_TO_STD = 1.4826
# Theoretical lower bounds of the two legs' scores: cosine similarity and BM25.
COSINE_MIN = -1.0
BM25_MIN = 0.0


@dataclass(frozen=True)
class FusionParams:
    """How hybrid mode fuses its legs: the fusion (FUSIONS), RRF's k ("rrf" only) and the vector leg's weight
    alpha (the convex fusions only). The settings (FUSION, RRF_K, FUSION_ALPHA) are where they are chosen."""

    fusion: str
    rrf_k: int
    alpha: float

    @classmethod
    def from_settings(cls, settings: Settings) -> FusionParams:
        return cls(settings.fusion, settings.rrf_k, settings.fusion_alpha)

    @classmethod
    def defaults(cls) -> FusionParams:
        """The settings' defaults (no environment read): what a store built without settings, and `fuse`, use."""
        return _DEFAULT_PARAMS

    def but(self, **overrides) -> FusionParams:
        """These parameters with those of `overrides` that are not None instead."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


_DEFAULT_PARAMS = FusionParams.from_settings(Settings.model_construct())


def fuse(
    vec_rows: list[tuple[str, dict]],
    fts_rows: list[tuple[str, dict]],
    qvec: np.ndarray | None = None,
    *,
    limit: int,
    fusion: str | None = None,
    rrf_k: int | None = None,
    alpha: float | None = None,
) -> list[Hit]:
    """Fuse the two legs' rows (each best first) into at most `limit` hits, best first (see FUSIONS).

    `fusion`, `rrf_k` and `alpha` not given are the settings' defaults (`FusionParams.defaults`). `alpha` weighs the vector leg in the convex fusions (1 - alpha the FTS leg). A chunk missing from a leg
    scores that leg's theoretical minimum (BM25 0, cosine -1), except that an FTS row carrying its stored vector
    gets its exact cosine similarity with `qvec`. Ties go to the higher cosine similarity, then index, then row
    id (where the legs give one), then id.

    A row is the same chunk in both legs by its row id when the legs return one (the store's legs always do; a
    slim leg returns nothing else), else by its id."""
    if fusion is None or rrf_k is None or alpha is None:
        params = FusionParams.defaults().but(fusion=fusion, rrf_k=rrf_k, alpha=alpha)
        fusion, rrf_k, alpha = params.fusion, params.rrf_k, params.alpha
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}")
    legs = _Legs(vec_rows, fts_rows)
    if qvec is not None:
        legs.fill_fts_cosines(qvec)
    if fusion == "rrf":
        fused = np.where(legs.in_vec, 1.0 / (rrf_k + legs.vector_rank), 0.0) + np.where(
            legs.in_fts, 1.0 / (rrf_k + legs.fts_rank), 0.0
        )
    else:
        fused = _convex(legs, fusion, alpha)
    return [_hit(legs, n, fused) for n in _top(legs, fused, limit)]


class _Legs:
    """The two legs' rows as one entry per chunk (its first row), numbered in the order the legs bring them, with
    its ranks, scores and vector as arrays: the scores are computed for all entries at once, and a Hit is only
    built for the `limit` kept (a search's legs bring about 200 rows, most of which go)."""

    def __init__(self, vec_rows: list[tuple[str, dict]], fts_rows: list[tuple[str, dict]]):
        vec_keys = [(name, row["_rowid"] if "_rowid" in row else row["id"]) for name, row in vec_rows]
        fts_keys = [(name, row["_rowid"] if "_rowid" in row else row["id"]) for name, row in fts_rows]
        number: dict[tuple[str, object], int] = {}
        self.rows: list[dict] = []
        for key, (_, row) in zip([*vec_keys, *fts_keys], [*vec_rows, *fts_rows], strict=True):
            if key not in number:
                number[key] = len(self.rows)
                self.rows.append(row)
        self.names = [name for name, _ in number]
        size = len(self.rows)
        self.vector_rank = np.zeros(size, dtype=np.int64)  # 0: not in the leg
        self.fts_rank = np.zeros(size, dtype=np.int64)
        self.cosine = np.full(size, np.nan)
        self.scores = np.full(size, np.nan)
        self.vectors: list = [None] * size
        if vec_rows:
            at = [number[key] for key in vec_keys]
            self.vector_rank[at] = np.arange(1, len(at) + 1)
            self.cosine[at] = 1.0 - np.array([float(row["_distance"]) for _, row in vec_rows])
            for n, (_, row) in zip(at, vec_rows, strict=True):
                if row.get("vector") is not None:
                    self.vectors[n] = row["vector"]
        if fts_rows:
            at = [number[key] for key in fts_keys]
            self.fts_rank[at] = np.arange(1, len(at) + 1)
            self.scores[at] = [float(row["_score"]) for _, row in fts_rows]
            for n, (_, row) in zip(at, fts_rows, strict=True):
                if self.vectors[n] is None and row.get("vector") is not None:
                    self.vectors[n] = row["vector"]
        self.cosine[~np.isfinite(self.cosine)] = np.nan
        self.scores[~np.isfinite(self.scores)] = np.nan
        self.in_vec = self.vector_rank > 0
        self.in_fts = self.fts_rank > 0

    def fill_fts_cosines(self, qvec: np.ndarray) -> None:
        """The cosine similarity of the chunks only the FTS leg found, from their stored vectors, in one product."""
        cosine, vectors = self.cosine, self.vectors
        only_fts = [
            n for n in np.flatnonzero(self.in_fts & np.isnan(cosine)).tolist() if vectors[n] is not None
        ]
        if not only_fts:
            return
        matrix = np.stack([vectors[n] for n in only_fts]).astype(np.float32, copy=False)
        qnorm = float(np.linalg.norm(qvec))
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix)).astype(np.float64) * qnorm
        with np.errstate(divide="ignore", invalid="ignore"):
            found = (matrix @ np.asarray(qvec, dtype=np.float32)).astype(np.float64) / norms
        cosine[only_fts] = np.where((norms > 0) & np.isfinite(found), found, np.nan)


def _convex(legs: _Legs, fusion: str, alpha: float) -> np.ndarray:
    """alpha x the normalised cosine + (1 - alpha) x the normalised BM25 score; the normalisation statistics come
    from each leg's own candidates, as the leg ranked them."""
    cosine, scores = legs.cosine, legs.scores
    norm_vec = normaliser(fusion, cosine[legs.in_vec & ~np.isnan(cosine)], COSINE_MIN)
    norm_fts = normaliser(fusion, scores[legs.in_fts & ~np.isnan(scores)], BM25_MIN)
    return alpha * norm_vec(np.where(np.isnan(cosine), COSINE_MIN, cosine)) + (1.0 - alpha) * norm_fts(
        np.where(np.isnan(scores), BM25_MIN, scores)
    )


def _top(legs: _Legs, fused: np.ndarray, limit: int) -> list[int]:
    """The entries of the fused top `limit`, best first. Only those that can make the cut are ordered: those
    scoring at least the `limit`-th best score."""
    size = len(legs.names)
    if size > limit:
        cut = np.partition(fused, size - limit)[size - limit]
        candidates = np.flatnonzero(fused >= cut).tolist()
    else:
        candidates = list(range(size))
    tie_cosine = np.where(np.isnan(legs.cosine), -2.0, legs.cosine)
    names, rows = legs.names, legs.rows
    candidates.sort(
        key=lambda n: (
            -fused[n],
            -tie_cosine[n],
            names[n],
            -1 if rows[n].get("_rowid") is None else rows[n]["_rowid"],
            rows[n].get("id", ""),
        )
    )
    return candidates[:limit]


def _hit(legs: _Legs, n: int, fused: np.ndarray) -> Hit:
    hit = to_hit(legs.names[n], legs.rows[n])
    hit.score = float(fused[n])
    hit.vector_score = None if np.isnan(legs.cosine[n]) else float(legs.cosine[n])
    hit.fts_score = None if np.isnan(legs.scores[n]) else float(legs.scores[n])
    hit.vector_rank = int(legs.vector_rank[n]) or None
    hit.fts_rank = int(legs.fts_rank[n]) or None
    hit.vector = legs.vectors[n]
    return hit


def normaliser(fusion: str, scores: np.ndarray, floor: float):
    """scores -> normalised scores (numpy arrays) for one leg: theoretical min-max ("tmm"), z-score ("zscore") or
    robust z-score ("robust"; the plain z-score's deviation where more than half the scores are equal, so the MAD
    is 0)."""
    if len(scores) == 0:
        return lambda s: np.zeros(np.shape(s))
    if fusion == "tmm":
        span = float(np.max(scores)) - floor
        return (lambda s: (s - floor) / span) if span > 0 else (lambda s: np.zeros(np.shape(s)))
    if fusion == "robust":
        median = _median(scores)
        mad = MAD_TO_STD * _median(np.abs(scores - median))
        if mad > 0:
            return lambda s: (s - median) / mad
    mean = float(np.mean(scores))
    std = float(np.std(scores))
    return (lambda s: (s - mean) / std) if std > 0 else (lambda s: s - mean)


def _median(values: np.ndarray) -> float:
    """np.median's value (the middle one, or the mean of the two middle ones) without its overhead, which is most
    of its cost for a leg's hundred scores."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    return float(ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2)
