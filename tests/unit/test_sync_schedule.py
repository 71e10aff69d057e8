"""The sync scheduler's claim rule (gateway/sync/schedule.py) on a real SQLite database: replicas polling at the
same moment claim each due source once, and a source is due again only `every` minutes later."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

from gateway.db import Database, Index, IndexSource, User, utcnow
from gateway.sync.schedule import claim_due


def make_db(tmp_path) -> tuple[Database, list[int]]:
    db = Database(f"sqlite:///{tmp_path / 'gateway.db'}")
    db.migrate()
    with db.session() as s:
        user = User(username="owner", password_hash="x")
        s.add(user)
        s.commit()
        index = Index(owner_id=user.id, name="team", worker_name="u1_team_abc")
        s.add(index)
        s.commit()
        past = utcnow() - timedelta(minutes=1)
        rows = [
            IndexSource(index_id=index.id, kind="s3", bucket=f"b{n}", every=15, next_run_at=past)
            for n in range(5)
        ]
        rows.append(IndexSource(index_id=index.id, kind="s3", bucket="manual"))  # no schedule
        rows.append(
            IndexSource(
                index_id=index.id,
                kind="s3",
                bucket="later",
                every=15,
                next_run_at=utcnow() + timedelta(hours=1),
            )
        )
        s.add_all(rows)
        s.commit()
        due = [r.id for r in rows[:5]]
    return db, due


def test_replicas_polling_together_claim_each_due_source_once(tmp_path):
    db, due = make_db(tmp_path)
    replicas = [SimpleNamespace(db=db) for _ in range(4)]
    claimed: list[list[int]] = []
    start = threading.Barrier(len(replicas))

    def poll(c):
        start.wait()
        claimed.append(claim_due(c))

    threads = [threading.Thread(target=poll, args=(c,)) for c in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [sid for batch in claimed for sid in batch]
    assert sorted(everything) == sorted(due)  # each due source once, by one replica; the others none
    assert claim_due(replicas[0]) == []  # next due in 15 minutes
    with db.session() as s:
        for sid in due:
            assert s.get(IndexSource, sid).next_run_at > utcnow() + timedelta(minutes=14)
    db.dispose()
