"""The chat turn: validate → fetch check → rewrite → triage → (HyDE) → retrieve → rerank → evaluate / retry →
expand → generate with citations → verify → provenance → done. One generator of typed events, two transports."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from contract import observe
from contract.answer import Answer

from .. import metrics
from ..errors import ApiError, NotFound
from ..i18n import FALLBACK, choose
from ..llm import CancelToken
from ..runtime import offload
from ..schemas import ChatRequest, option_defaults
from ..services import Services
from ..telemetry import stage_span, trace_id
from . import (
    citations,
    expand,
    fetch_check,
    generate,
    provenance,
    relevance,
    retrieve,
    rewrite,
    sql,
    triage,
)
from .admission import queued
from .events import Documents, Done, Error, Event, Token
from .grounding import Grounder
from .turn import Turn, TurnOptions

log = logging.getLogger("rag_worker.pipeline")


def resolve_options(services: Services, request: ChatRequest) -> TurnOptions:
    o, d = request.options, option_defaults(services.settings)
    return TurnOptions(
        route=o.route,
        rewrite=d["rewrite"] if o.rewrite is None else o.rewrite,
        hyde=d["hyde"] if o.hyde is None else o.hyde,
        rerank=d["rerank"] if o.rerank is None else (o.rerank and d["rerank"]),
        mode=o.mode or d["mode"],
        top_k=o.top_k or d["top_k"],
        provenance=o.provenance or d["provenance"],
        model=o.model,
        temperature=o.temperature,
        max_tokens=o.max_tokens,
        prompts=dict(o.prompts or {}),
        stop=list(o.stop or []),
        grounding=o.grounding,
        answer_mode=o.answer_mode,
    )


def prepare(services: Services, request: ChatRequest, cancel: CancelToken | None = None) -> Turn:
    """Everything that can fail before the first byte: unknown index (404), embedder mismatch (409)."""
    options = resolve_options(services, request)
    observe.index_name.set(",".join(request.indexes)[:200] or None)  # for the turn's log lines
    # A direct turn reads no index: `docs` sent with it are context only, so a deleted index is no 404.
    if options.route != "direct":
        for index in request.indexes:
            if not services.store.exists(index):
                raise NotFound(
                    f"index '{index}' does not exist; add documents to it first (POST /add_document "
                    "or POST /index)",
                    code="index_not_found",
                    field="index",
                )
            services.store.check_compatible(index)
    turn = Turn(services, request, options, services.llm.resolve(), cancel or CancelToken())
    if (tid := trace_id()) is not None:  # tracing on: the done event names the turn's trace
        turn.timings["trace_id"] = tid
    # Native code; its first call loads the models (seconds). The hint (the interface's language) decides only a
    # message too short or unsure to detect.
    turn.language, turn.language_source = offload(choose, request.prompt, request.options.language)
    if options.route != "direct" and request.indexes:
        # The indexes' one embedder (a 400 for indexes built with different ones): the turn's queries use it.
        turn.embedder = services.store.query_embedder(services.store.open_tables(request.indexes))
    return turn


def run_turn(turn: Turn) -> Iterator[Event]:
    """Yield the turn's events; exactly one Done or Error comes last. Closing the generator cancels the model.
    The turn's metrics are recorded once, at its end, from its timings (rag_worker/metrics.py)."""
    with turn.carried.restored():  # this request's log context and trace, in whichever greenlet runs it
        try:
            yield from _run(turn)
        except ApiError as exc:
            turn.outcome = "failed"
            yield Error(exc.message, exc.code, exc.status)
        except Exception as exc:  # the stream must end with an error event, never a dropped connection
            turn.outcome = "failed"
            log.exception("chat turn failed")
            yield Error(turn.message("turn_failed", kind=type(exc).__name__), "internal", 500)
        finally:
            turn.cancel.cancel()
            route = turn.route or turn.options.route
            metrics.observe_turn(route, turn.outcome, turn.timings, turn.tokens, turn.grounding)


@dataclass
class Sources:
    """What a turn answers from: its route, the query it searched with and the documents that search found."""

    route: str
    query: str
    rewritten: str | None = None
    documents: list[dict] = field(default_factory=list)
    fetched_new: bool = False
    abstained: bool = False
    retried_query: str | None = None  # the relevance check's second search, when the documents came from it


def _run(turn: Turn) -> Iterator[Event]:
    src = yield from _gather(turn)
    if src.route in ("rag", "sql"):
        yield Documents(src.documents)
    rag = src.route == "rag" and bool(src.documents) and not src.abstained
    grounder = Grounder(turn, src.query, src.documents) if rag else None
    reply = yield from _generate(turn, src, grounder)
    reply, cited = yield from _verify(turn, src, grounder, reply)
    turn.timings["total_ms"] = turn.elapsed_ms()
    turn.route, turn.outcome = src.route, "abstained" if src.abstained else "answered"
    yield Done(_answer(turn, reply, src, cited))


def _gather(turn: Turn):
    """The documents the turn answers from: those in hand when the fetch check keeps them, else a (rewritten)
    question triaged to a route and searched (rag) or computed over tables (sql). Returns Sources."""
    req, opts = turn.request, turn.options
    src = Sources(opts.route if opts.route in ("direct", "sql") else "rag", req.prompt)
    if req.docs and src.route == "rag" and not (yield from _fetch_check(turn)):
        src.documents = [d.model_dump() for d in req.docs]
        return src
    if any(m.role == "user" for m in req.history) and opts.rewrite:
        yield turn.step("rewriting", "Making the question standalone")
        with turn.timed("rewrite_ms"):
            rw = rewrite.rewrite(turn)
        src.query, src.rewritten = rw.query, rw.rewritten
        yield turn.step(
            "rewriting",
            f"Searching for: {src.query}" if src.rewritten else "The question stands alone",
            rw.method,
            rewritten=src.rewritten,
        )
    if opts.route == "auto":
        yield turn.step("triage", "Deciding whether the documents are needed")
        with turn.timed("triage_ms"):
            tri = triage.triage(turn, src.query)
        src.route = tri.route
        yield turn.step("triage", tri.reason, tri.method, route=src.route)
    if src.route == "sql":
        src.documents, src.route = yield from sql.sql_turn(turn, src.query)
        src.fetched_new = bool(src.documents)
    if src.route == "rag":
        if opts.mode != "fts":  # embedded now, batched with concurrent turns' queries; search reuses it
            turn.embed_query(src.query)
        yield from _retrieve(turn, src)
        src.fetched_new = True
    return src


def _fetch_check(turn: Turn):
    """Whether a follow-up needs a new search (False: the documents sent back with it answer it)."""
    yield turn.step("fetch_check", "Checking whether the documents in hand answer the follow-up")
    with turn.timed("fetch_check_ms"):
        decision = fetch_check.check(turn)
    yield turn.step("fetch_check", decision.reason, decision.method, fetch=decision.fetch)
    return decision.fetch


def _generate(turn: Turn, src: Sources, grounder: Grounder | None):
    """Stream the answer (canned when abstaining, quotes in extractive mode, else the model's); returns it."""
    answer_parts: list[str] = []
    yield turn.step(
        "generating", "Writing the answer" if not src.abstained else "Not enough evidence to answer"
    )
    t_gen = time.monotonic()
    watch = None
    if src.abstained:
        pieces: Iterator[str] = generate.words_of(turn.prompt("abstain"))
    elif grounder is not None and grounder.extractive:
        pieces = generate.words_of(grounder.quotes())
    else:
        if src.route in ("rag", "sql"):
            system = generate.sources_message(turn, src.documents)
            messages = generate.llm_messages(turn, turn.prompt("system"), system)
            watch = grounder.watch() if grounder is not None else None
        else:
            messages = generate.llm_messages(turn, turn.prompt("direct"), None)
        pieces = generate.stream_answer(turn, messages)
    with stage_span("generate"):
        for piece in pieces:
            if not answer_parts:
                turn.timings["llm_first_token_ms"] = int((time.monotonic() - t_gen) * 1000)
                turn.timings["first_token_ms"] = turn.elapsed_ms()
            answer_parts.append(piece)
            yield Token(piece)
            if watch is not None and watch.feed(piece):
                pieces.close()  # the draft can no longer pass the check: stop the model, the policy replaces it
                turn.flags["draft_stopped"] = True
                break
    turn.timings["generate_ms"] = int((time.monotonic() - t_gen) * 1000)
    turn.tokens = len(answer_parts)
    return "".join(answer_parts).strip()


def _verify(turn: Turn, src: Sources, grounder: Grounder | None, reply: str):
    """The grounding check and its policy, then the citations and provenance; returns (reply, citations). A
    refused draft makes the turn an abstention."""
    cited: list[dict] = []
    if grounder is not None:
        yield turn.step("grounding", "Checking each sentence against the sources")
        # The check embeds the passages' sentences: CPU work, queued like retrieval and provenance.
        with (yield from queued(turn, answered=True)), turn.timed("grounding_ms"):
            reply, src.abstained = grounder.review(reply)
        yield turn.step("grounding", grounder.summary(), turn.grounding["action"])
    if src.route in ("rag", "sql") and not src.abstained:
        documents = src.documents
        yield turn.step("verifying", "Checking citations")
        reply, cited, invented = citations.validate(reply, documents)
        turn.flags["invented_refs"] = invented
        turn.flags["uncited"] = bool(documents) and not cited
        if turn.options.provenance != "none" and documents:
            yield turn.step("provenance", "Measuring how much each document contributed")
            with (yield from queued(turn, answered=True)), turn.timed("provenance_ms"):
                turn.flags["provenance_method"] = provenance.attribute(
                    turn, reply, documents, turn.options.provenance
                )
    return reply, cited


def _retrieve(turn: Turn, src: Sources):
    """Search for `src.query` (with one improved retry) and decide on abstention: fills in the documents, whether
    the turn abstains, and the retry's query when the documents came from it.

    The CPU-bound parts (search, rerank, the evidence score, the expansion) hold one of the worker's slots
    (admission.queued); the model's calls on the default path (the relevance check's YES/NO in the unsure band,
    the retry's query) do not: a slot held while the model answers kept every turn behind it waiting on the
    model, where the queue exists to share the CPU (docs/benchmarks.md, the thirteenth round). Passages relevant
    by their score alone keep the slot through the expansion; a turn that freed it for the model waits for one
    again, keeping its place in line (its ticket is its arrival). HyDE (opt-in) still asks the model inside its
    slot."""
    req, opts, query = turn.request, turn.options, src.query
    vector = None
    if opts.hyde:
        with (yield from queued(turn)):
            yield turn.step("hyde", "Imagining an answer to search with")
            with turn.timed("hyde_ms"):
                vector = retrieve.hyde_vector(turn, query)
        turn.flags["hyde"] = vector is not None
    scope = (
        f"{len(req.datasets)} dataset{'s' if len(req.datasets) != 1 else ''}"
        if req.datasets
        else "all datasets"
    )
    with contextlib.ExitStack() as slot:
        slot.enter_context((yield from queued(turn)))
        held = True
        yield turn.step("retrieving", f"Searching {scope} ({opts.mode})", opts.mode)
        with turn.timed("retrieve_ms"):
            hits = retrieve.search(turn, query, vector)
        if opts.rerank and turn.services.reranker is None:  # configured but broken: skipped, and said so
            reason = turn.services.reranking.error
            yield turn.step(
                "reranking", "Reranking skipped: the reranker could not be loaded", "skipped", reason=reason
            )
        elif opts.rerank:
            yield turn.step("reranking", f"Reranking {len(hits)} passages")
            with turn.timed("rerank_ms"):
                hits = retrieve.rerank(turn, query, hits)
        score = relevance.evidence(turn, query, hits)
        # Passages relevant by their score alone go on to the expansion in this same slot; otherwise the model
        # is asked next (its YES/NO, or the retry's query): the slot is freed first.
        decided = relevance.by_score(turn, hits, score)
        if decided is None or not decided.relevant:
            slot.close()
            held = False
        yield turn.step("evaluating", "Checking the passages answer the question")
        with turn.timed("evaluate_ms"):
            verdict = decided or relevance.judge(turn, query, hits, score=score)
        yield turn.step(
            "evaluating",
            verdict.reason,
            verdict.method,
            relevant=verdict.relevant,
            evidence=round(verdict.evidence, 4),
        )
        retried = None
        if not verdict.relevant:
            hits, verdict, retried = yield from _retry(turn, query, hits)
        turn.flags["evidence"] = round(verdict.evidence, 4)
        if not verdict.relevant:
            src.documents, src.abstained = [], True
            return
        src.retried_query = retried
        yield from _expand(turn, src, query, hits, held)


def _expand(turn: Turn, src: Sources, query: str, hits: list, held: bool):
    """The passages worth showing, each with its neighbours, into `src.documents`: in the slot the turn still
    holds (`held`), or in a new one when it freed its slot for the model (keeping its place in line)."""
    opts = turn.options
    with contextlib.ExitStack() as slot:
        if not held:
            slot.enter_context((yield from queued(turn)))
        # Passages far below the evidence floor would only be noise on the cards and in the prompt.
        floor = turn.evidence_thresholds()[0]
        top = relevance.above_floor(turn, query, hits[: opts.top_k], floor)
        documents = [expand.to_document(h, rank=i + 1, ref=f"S{i + 1}") for i, h in enumerate(top)]
        turn.chunk_vectors.update({(h.index, h.id): h.vector for h in top if h.vector is not None})
        yield turn.step("expanding", "Adding neighbouring passages")
        with turn.timed("expand_ms"):
            added = expand.expand(turn, documents, {(h.index, h.id): h.row_id for h in top})
    turn.flags["expanded_chunks"] = added
    src.documents = documents


def _retry(turn: Turn, query: str, hits: list):
    """The relevance check's second search, with the query it says it searches for; returns (the better of the
    two attempts' hits, its verdict, the retry's query when its hits were kept, else None). The model writes the
    query and judges outside the worker's slots; the search and its scoring hold one."""
    yield turn.step("retrying", "Searching again with a better query")
    with turn.timed("retry_ms"):
        better, how = relevance.improved_query(turn, query)
    turn.flags["retried"] = {"query": better, "method": how}
    yield turn.step("retrying", f"Searching again for: {better}", how, query=better)
    with (yield from queued(turn)), turn.timed("retry_ms"):
        retry_hits = retrieve.search(turn, better)
        if turn.options.rerank:
            retry_hits = retrieve.rerank(turn, query, retry_hits)
        best = relevance.best_of(turn, query, hits, retry_hits)
        score = relevance.evidence(turn, query, best)
    with turn.timed("retry_ms"):
        verdict = relevance.judge(turn, query, best, score=score)
    used = best is retry_hits
    # A client keeps the stage's last label (the web shows it under "Searching again"): it names the query.
    kept = "" if used else "; the first search's passages stay"
    yield turn.step(
        "retrying",
        f"Searched for: {better}{kept} ({verdict.reason})",
        verdict.method,
        query=better,
        used=used,
        relevant=verdict.relevant,
        evidence=round(verdict.evidence, 4),
    )
    return best, verdict, better if used else None


def _answer(turn: Turn, reply: str, src: Sources, cited: list[dict]) -> Answer:
    req, documents = turn.request, src.documents
    history = [m.model_dump() for m in req.history]
    history.append({"role": "user", "content": req.prompt})
    if documents:
        injected = generate.sources_message(turn, documents)
        last_system = next((m["content"] for m in reversed(history) if m["role"] == "system"), None)
        if injected != last_system:
            history.append({"role": "system", "content": injected})
    history.append({"role": "assistant", "content": reply})
    answer = {
        "reply": reply,
        "question": req.prompt,
        "rewritten": src.rewritten,
        "retried_query": src.retried_query,
        "history": history,
        "documents": documents,
        "fetched_new_documents": src.fetched_new,
        "route": src.route,
        "citations": cited,
        "abstained": src.abstained,
        "grounding": turn.grounding,
        "model": turn.generation_model,
        "llm_backend": turn.llm.backend.backend,
        "flags": turn.flags,
        "timings": turn.timings,
        "language": {"code": turn.language or FALLBACK, "source": turn.language_source},
    }
    return Answer.model_validate(answer)
