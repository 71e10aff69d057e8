"""A turn in this replica's memory: its plan, what the worker has said so far, and who follows it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from contract.answer import Answer

from .. import answers
from ..sse import Frame, Listeners
from ..streams import event_error
from ..worker_answer import read_answer


@dataclass
class TurnPlan:
    """Everything a turn needs, read from the database once, before the worker is called."""

    chat_id: int
    message: str
    route: str
    reason: str
    datasets: list[str]
    datasets_changed: bool
    needs_title: bool
    payload: dict
    message_id: int = 0
    user_message_id: int = 0
    gate: dict = field(default_factory=dict)
    user_id: int = 0


@dataclass
class TurnRecord:
    """What the worker has said so far in this turn."""

    steps: list[dict] = field(default_factory=list)
    documents: list[dict] | None = None
    tokens: list[str] = field(default_factory=list)
    done: Answer | None = None
    error: dict | None = None
    status: str = "running"  # complete | interrupted | failed
    message_id: int | None = None
    user_message_id: int | None = None
    error_status: int = 502
    stopped: bool = False
    documents_changed: bool = False
    # Steps worth a periodic save: each but a `queued` step that follows another (the worker's queue sends one
    # per position change, up to one per turn ahead; the list is saved whole, with the next step or the end).
    step_changes: int = 0

    def see(self, f: Frame) -> None:
        data = f.data if isinstance(f.data, dict) else {}
        if f.event == "step":
            if not (data.get("step") == "queued" and self.steps and self.steps[-1].get("step") == "queued"):
                self.step_changes += 1
            self.steps.append(data)
        elif f.event == "documents":
            self.documents = data.get("documents") or []
            self.documents_changed = True
        elif f.event == "token":
            self.tokens.append(str(data.get("token", "")))
        elif f.event == "done":
            self.done, problem = read_answer(data)
            if problem:
                self.error = {"error": problem, "code": "worker_contract"}
        elif f.event == "error":
            failed = event_error(data)
            self.error = {"error": failed.message, "code": failed.code}
            self.error_status = failed.status

    @property
    def partial_reply(self) -> str:
        return "".join(self.tokens)


class TurnHandle(Listeners):
    """A turn this replica is reading from the worker: its record, its listeners and its stop switch."""

    def __init__(self, plan: TurnPlan):
        super().__init__()
        self.plan = plan
        self.rec = TurnRecord(message_id=plan.message_id, user_message_id=plan.user_message_id)
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()  # enough unsaved tokens: save now rather than at the next heartbeat
        self.finishing = False  # the final save is next: the periodic saves end
        self.task: asyncio.Task | None = None
        self.saved_tokens = 0
        self.saved_steps = 0
        self.started = time.monotonic()
        self.first_token_at: float | None = None  # when the first answer token was relayed (the metrics')

    def snapshot(self) -> dict:
        rec = self.rec
        return {
            "message_id": self.plan.message_id,
            "user_message_id": self.plan.user_message_id,
            "question": self.plan.message,
            "route": self.plan.gate,
            "status": "running",
            "steps": rec.steps,
            "documents": rec.documents,
            "answer": rec.partial_reply,
            "done": answers.stored_json(rec.done) if rec.done is not None else None,
        }
