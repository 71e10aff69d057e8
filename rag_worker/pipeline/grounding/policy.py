"""The grounding policy of a turn: which answer mode and policy apply, and what happens when a draft fails.

- `flag`: keep the answer; its unsupported sentences are marked in `done.grounding` (the web marks them).
- `extract`: replace the answer with the extractive one (quotes of the sources, with a caveat saying why).
- `refuse`: abstain and say why.
Defaults: `extract` for the embedded model, `flag` for Ollama. ANSWER_MODE=extractive (or options.answer_mode)
skips generation on the embedded model and quotes at once.

`Grounder` is the chat pipeline's one door to all of it: made once per turn that answers from sources, it says
whether to quote instead of generating, watches the draft as it streams, and reviews the finished reply.
"""

from __future__ import annotations

from ..generate import is_local
from ..turn import Turn
from .check import StreamWatch, passed
from .check import check as check_reply
from .quotes import answer as quote
from .stored import load as load_stored


def policy_for(turn: Turn) -> str:
    """options.grounding, else GROUNDING_POLICY, else the embedded model's own default (per model, chosen on
    measurements), else `flag`."""
    if turn.options.grounding or turn.settings.grounding_policy:
        return turn.options.grounding or turn.settings.grounding_policy
    if is_local(turn):
        return getattr(turn.llm.backend, "grounding_policy", "extract")
    return "flag"


def extractive_only(turn: Turn) -> bool:
    """Answer with quotes and no generation: asked per request, or ANSWER_MODE=extractive on the embedded model."""
    if turn.options.answer_mode:
        return turn.options.answer_mode == "extractive"
    return is_local(turn) and turn.settings.answer_mode == "extractive"


def all_passages(documents: list[dict]) -> dict[str, str]:
    return {d["ref"]: (d.get("context") or d["text"]) for d in documents if d.get("ref")}


def summary(g: dict) -> str:
    done = f"{g['supported']} of {g['checked']} sentences supported by the sources"
    return {
        "flagged": f"{done}: unsupported ones are marked",
        "extracted": "The draft was not supported by the sources: quoting them instead",
        "refused": f"Only {done}: not showing the draft",
    }.get(g.get("action"), done)


class Grounder:
    """The grounding of one turn that answers `question` from `documents` (the rag route, with sources)."""

    def __init__(self, turn: Turn, question: str, documents: list[dict]):
        self.turn, self.question, self.documents = turn, question, documents
        self.policy = policy_for(turn)
        self.answer_mode = "extractive" if extractive_only(turn) else "generated"
        self._stored = False

    def _with_stored_vectors(self) -> None:
        """Before the first check or quote: the sentence vectors stored with the chunks read (once a turn)."""
        if not self._stored:
            self._stored = True
            read = [*self.passages().values(), *all_passages(self.documents).values()]
            self.turn.stored_sentences += load_stored(self.turn, self.documents, read)
            self.turn.flags["stored_sentences"] = self.turn.stored_sentences

    @property
    def extractive(self) -> bool:
        """Quote the sources instead of generating (the answer mode, not the `extract` policy's fallback)."""
        return self.answer_mode == "extractive"

    def passages(self) -> dict[str, str]:
        """{ref: text} the generator read (all documents' full context when it read none, as for quotes)."""
        if self.turn.read:
            return dict(self.turn.read)
        return all_passages(self.documents)

    def quotes(self) -> str:
        self._with_stored_vectors()
        return quote(self.turn, self.question, all_passages(self.documents), self.documents)

    def watch(self) -> StreamWatch | None:
        """A sentence-by-sentence check of the stream, when a failing draft would be replaced anyway. Made after
        the sources message, so it checks against what the generator reads."""
        if self.policy == "flag" or not self.documents:
            return None
        self._with_stored_vectors()
        return StreamWatch(self.turn, self.passages(), self.documents)

    def review(self, reply: str) -> tuple[str, bool]:
        """Check the finished `reply` and act on a failure; returns (the reply to show, refused). The result is
        the turn's `grounding` (and `flags.grounding` its action)."""
        reply, g, refused = self._act(reply)
        self.turn.grounding = g
        self.turn.flags["grounding"] = g["action"]
        return reply, refused

    def summary(self) -> str:
        return summary(self.turn.grounding or {})

    def _act(self, reply: str) -> tuple[str, dict, bool]:
        turn, documents, act = self.turn, self.documents, self.policy
        self._with_stored_vectors()
        reply, g = check_reply(turn, reply, self.passages(), documents)
        g.update(policy=act, answer_mode=self.answer_mode, action="none")
        self._flag_corrections(g)
        if self.extractive or passed(g, turn.settings.grounding_min_share):
            return reply, g, False
        draft = {k: g[k] for k in ("supported_share", "supported", "checked")}
        if act == "flag":
            g["action"] = "flagged"
            return reply, g, False
        if act == "refuse":
            g.update(action="refused", draft=draft)
            return turn.prompt("ungrounded"), g, True
        # The caveat is the system speaking, not a claim from the sources: only the quotes are checked.
        quoted, g2 = check_reply(turn, self.quotes(), all_passages(documents), documents)
        caveat = turn.prompt("extract_caveat").strip()
        if caveat:
            quoted = f"{caveat}\n\n{quoted}"
            for e in g2["sentences"]:
                e["start"] += len(caveat) + 2
                e["end"] += len(caveat) + 2
        g2.update(policy=act, answer_mode="extractive", action="extracted", draft=draft)
        return quoted, g2, False

    def _flag_corrections(self, g: dict) -> None:
        added = sum(bool(s.get("citation_added")) for s in g["sentences"])
        if added:
            self.turn.flags["added_citations"] = added
        corrected = [s for s in g["sentences"] if s.get("corrected_from")]
        if not corrected:
            return
        known = {d.get("ref") for d in self.documents}
        self.turn.flags["corrected_citations"] = len(corrected)
        # Invented refs the check replaced never reach citations.validate: say here that the model made them up.
        invented = [r for s in corrected for r in s["corrected_from"] if r not in known]
        if invented:
            self.turn.flags["invented_refs_corrected"] = list(dict.fromkeys(invented))
