"""What one account may ask of the shared machine: running turns and uploads being indexed at once, and answer
length.

A turn holds worker threads (the embedded model's, or an Ollama slot) for as long as it runs, and an upload holds
the worker's converter and embedder, so one account with many chats or files open could occupy all of them.
Running turns are counted in the database, on every gateway process and replica (gateway/turns/running.py).
Uploads: the account's unfinished upload jobs in the database, plus the uploads this process is receiving
(gateway/indexes/uploads.py), counted again in the transaction that queues the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import BadRequest, TooManyRequests
from .schemas import TurnOptions
from .settings import Settings


@dataclass
class TurnSlot:
    slots: TurnSlots
    user_id: int
    released: bool = False

    def release(self, *_ignored: object) -> None:
        """Give the slot back (idempotent; usable as a task's done callback)."""
        if not self.released:
            self.released = True
            self.slots.give_back(self.user_id)


@dataclass
class TurnSlots:
    """Uploads one user is sending to this process (MAX_UPLOADS_PER_USER, beside its unfinished jobs)."""

    per_user: int
    running: dict[int, int] = field(default_factory=dict)
    # The 429's code, and what the user has too many of ("you already have N ...").
    code: str = "too_many_turns"
    what: str = "answers being written"

    def take(self, user_id: int) -> TurnSlot:
        """A slot for one more running piece of work, or a 429 when the user already has `per_user` running."""
        if self.running.get(user_id, 0) >= self.per_user:
            raise TooManyRequests(
                f"you already have {self.per_user} {self.what}: wait for one to finish",
                code=self.code,
                headers={"Retry-After": "5"},
            )
        self.running[user_id] = self.running.get(user_id, 0) + 1
        return TurnSlot(self, user_id)

    def give_back(self, user_id: int) -> None:
        left = self.running.get(user_id, 0) - 1
        if left > 0:
            self.running[user_id] = left
        else:
            self.running.pop(user_id, None)


def upload_slots(per_user: int) -> TurnSlots:
    """Uploads being indexed per user: taken before the body is read, given back when the worker's answer has
    been relayed, or failed, or the browser went away before it started (`streams.RelayedResponse`)."""
    return TurnSlots(per_user=per_user, code="too_many_uploads", what="files being indexed")


def check_options(options: TurnOptions | None, settings: Settings) -> None:
    """Limits that depend on this server's settings (the schema already checked types and ranges)."""
    if options is not None and options.max_tokens is not None and options.max_tokens > settings.max_tokens:
        raise BadRequest(
            f"max_tokens may be at most {settings.max_tokens} on this server",
            code="too_large",
            field="options.max_tokens",
        )
