"""The `demo` index run_system.py builds from the project's own docs, given to the first (admin) user and
shared with everyone signed in (as readers)."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from ..context import Context, in_thread
from ..db import Index, IndexGrant
from ..errors import ApiError
from .reconcile import sync_documents
from .settings import backfill

DEMO_TABLE = "demo"


async def adopt_demo_index(c: Context, owner_id: int) -> None:
    """Give the first (admin) user the `demo` index that run_system.py builds from the project's own docs.

    The worker table exists before anyone has registered, so no gateway row points at it; without this the
    newcomer the demo is for could not find it in the web chat. A worker without a demo table is fine.
    """
    try:
        listed = await c.worker.get_documents(DEMO_TABLE)
    except ApiError:
        return
    if not listed:
        return

    def create() -> int | None:
        with c.db.session() as s:
            if s.exec(select(Index.id).where(Index.worker_name == DEMO_TABLE)).first():
                return None
            index = Index(
                owner_id=owner_id,
                name="demo",
                worker_name=DEMO_TABLE,
                status="ready",
                description="This project's own README and docs, indexed on first start",
            )
            s.add(index)
            try:
                s.flush()
                s.add(IndexGrant(index_id=index.id, subject_type="everyone", subject_id=0, role="reader"))
                s.commit()
            except IntegrityError:
                return None
            s.refresh(index)
            return index.id

    index_id = await in_thread(create)
    if index_id is not None:
        await sync_documents(c, index_id)
        await backfill(c)  # its embedder and language, from the worker's marker of the demo table
