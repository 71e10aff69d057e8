"""contract/sync.py's bookkeeping on a real folder, with a target that records what it was asked to do (the
real targets are exercised in tests/integration/ingest/test_sync.py): which files are read, added, re-indexed
and removed between runs, and what a sync never touches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract.sync import (
    FolderSource,
    JsonState,
    Summary,
    SyncError,
    parse_roots,
    root_problem,
    run_to_end,
    sha256_of,
    sync,
)


class RecordingTarget:
    def __init__(self):
        self.docs: dict[tuple[str, str], str] = {}
        self.added: list[tuple[str, str]] = []
        self.removed: list[tuple[str, str]] = []
        self.fail_on: set[str] = set()  # refused for good (a file that does not convert)
        self.away_for: set[str] = set()  # refused for a reason that may pass (the worker away)
        self.tries: list[str] = []  # every file it was asked to add, in order

    def documents(self):
        return dict(self.docs)

    def check(self, dataset, filename):
        if not dataset.replace("-", "").replace("_", "").isalnum():
            raise SyncError("bad_name", f"dataset {dataset!r} is not a name")
        return dataset, filename

    def supported(self, filename):
        return filename.endswith((".md", ".txt"))

    def add(self, dataset, filename, path):
        self.tries.append(filename)
        if filename in self.fail_on:
            raise SyncError("conversion_failed", "cannot convert", lasting=True)
        if filename in self.away_for:
            raise SyncError("worker_unavailable", "the worker is away")
        self.docs[(dataset, filename)] = sha256_of(path)
        self.added.append((dataset, filename))

    def remove(self, dataset, filename):
        del self.docs[(dataset, filename)]
        self.removed.append((dataset, filename))


@pytest.fixture
def setup(tmp_path):
    folder = tmp_path / "src"
    (folder / "team").mkdir(parents=True)
    (folder / "a.md").write_text("alpha")
    (folder / "b.md").write_text("beta")
    (folder / "team" / "c.md").write_text("gamma")
    target = RecordingTarget()
    state = JsonState(tmp_path / "state.json", FolderSource(folder).key)
    return folder, target, state


def run(folder, target, state, events=None) -> Summary:
    return run_to_end(sync(FolderSource(folder), target, state), (events or []).append)


def test_add_change_delete_between_runs(setup):
    folder, target, state = setup
    first = run(folder, target, state)
    assert (first.added, first.changed, first.removed, first.unchanged) == (3, 0, 0, 0)
    assert sorted(target.added) == [("default", "a.md"), ("default", "b.md"), ("team", "c.md")]
    target.docs[("default", "by-hand.md")] = "f" * 64  # uploaded by hand
    target.added.clear()

    (folder / "a.md").write_text("alpha, second version")
    (folder / "b.md").unlink()
    (folder / "team" / "d.md").write_text("delta")
    second = run(folder, target, state)
    assert (second.added, second.changed, second.removed, second.unchanged) == (1, 1, 1, 1)
    assert sorted(target.added) == [("default", "a.md"), ("team", "d.md")]
    assert target.removed == [("default", "b.md")]
    assert target.docs[("default", "by-hand.md")] == "f" * 64
    assert second.hashed == 2  # c.md was not read again

    third = run(folder, target, state)
    assert (third.added, third.changed, third.removed, third.unchanged, third.hashed) == (0, 0, 0, 3, 0)


def test_touched_file_is_hashed_but_not_reindexed(setup):
    folder, target, state = setup
    run(folder, target, state)
    target.added.clear()
    st = (folder / "a.md").stat()
    os.utime(folder / "a.md", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    again = run(folder, target, state)
    assert (again.unchanged, again.hashed, target.added) == (3, 1, [])
    assert run(folder, target, state).hashed == 0  # the new mtime was recorded


def test_hand_uploaded_document_is_never_replaced_nor_removed(setup):
    folder, target, state = setup
    target.docs[("default", "a.md")] = "e" * 64  # an upload of another a.md before the first sync
    events = []
    first = run(folder, target, state, events)
    assert [f["code"] for f in first.failed] == ["name_taken"]
    assert target.docs[("default", "a.md")] == "e" * 64
    (folder / "a.md").unlink()
    second = run(folder, target, state)
    assert second.removed == 0 and target.docs[("default", "a.md")] == "e" * 64


def test_document_replaced_by_hand_after_a_sync_is_kept_when_its_file_goes(setup):
    folder, target, state = setup
    run(folder, target, state)
    target.docs[("default", "b.md")] = "d" * 64  # someone uploaded their own b.md over the synced one
    (folder / "b.md").unlink()
    after = run(folder, target, state)
    assert after.removed == 0 and target.docs[("default", "b.md")] == "d" * 64


def test_failures_are_per_file_and_the_run_goes_on(setup, tmp_path):
    folder, target, state = setup
    (folder / "bad.md").write_text("x")
    target.fail_on.add("bad.md")
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "deep" / "er" / "x.md").write_text("too deep")
    (folder / "bad name!").mkdir()
    (folder / "bad name!" / "y.md").write_text("y")
    (folder / "notes.exe").write_bytes(b"MZ")
    (folder / ".DS_Store").write_bytes(b"\0")
    outside = tmp_path / "secret.md"
    outside.write_text("outside the folder")
    (folder / "link.md").symlink_to(outside)
    (folder / "inside.md").symlink_to(folder / "a.md")
    summary = run(folder, target, state)
    codes = {f["file"]: f["code"] for f in summary.failed}
    assert codes == {
        "bad.md": "conversion_failed",
        "deep/er": "nested_folder",
        "bad name!/y.md": "bad_name",
        "notes.exe": "unsupported_type",
        "link.md": "symlink_escapes",
    }
    assert summary.added == 4  # a, b, inside (a symlink that stays inside), team/c
    assert ("default", "link.md") not in target.docs


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_a_per_file_error_and_keeps_its_document(setup):
    folder, target, state = setup
    run(folder, target, state)
    (folder / "b.md").write_text("beta, changed")
    os.chmod(folder / "b.md", 0)
    try:
        summary = run(folder, target, state)
    finally:
        os.chmod(folder / "b.md", 0o600)
    assert [(f["file"], f["code"]) for f in summary.failed] == [("b.md", "unreadable")]
    assert ("default", "b.md") in target.docs and summary.removed == 0


def test_a_folder_that_cannot_be_listed_removes_nothing(setup):
    folder, target, state = setup
    run(folder, target, state)
    folder.rename(folder.with_name("gone"))
    summary = run(folder, target, state)
    assert not summary.listed and summary.removed == 0 and len(target.docs) == 3
    assert summary.failed[0]["code"] == "source_unreachable"


def test_a_run_cut_short_keeps_the_records_it_did_not_reach(setup):
    folder, target, state = setup
    run(folder, target, state)
    (folder / "b.md").unlink()
    asked = iter([False, True])
    summary = run_to_end(sync(FolderSource(folder), target, state, should_stop=lambda: next(asked, True)))
    assert summary.removed == 0  # the listing was not walked to its end: no removal
    assert run(folder, target, state).removed == 1


def test_roots(tmp_path):
    inside = tmp_path / "root" / "team"
    inside.mkdir(parents=True)
    roots = parse_roots(str(tmp_path / "root"))
    assert root_problem(inside, roots) is None
    assert "outside" in root_problem(tmp_path, roots)
    assert "outside" in root_problem(inside / ".." / "..", roots)
    (tmp_path / "root" / "escape").symlink_to(tmp_path)
    assert "outside" in root_problem(tmp_path / "root" / "escape", roots)
    assert "absolute" in root_problem("relative/path", roots)
    assert "SYNC_ROOTS" in root_problem(inside, ())
    with pytest.raises(ValueError):
        parse_roots("relative")
    assert parse_roots(f"{tmp_path}:{inside}") == (
        Path(os.path.realpath(tmp_path)),
        Path(os.path.realpath(inside)),
    )


class ForgetfulState:
    """Records that are never written: a run killed before its bookkeeping was saved."""

    def load(self):
        return {}

    def save(self, state):
        pass


def test_a_run_killed_before_saving_its_records_indexes_nothing_twice(setup):
    folder, target, _ = setup
    run_to_end(sync(FolderSource(folder), target, ForgetfulState()))
    target.added.clear()
    again = run_to_end(sync(FolderSource(folder), target, ForgetfulState()))
    # Every file is read again (no records), found under its name with its bytes: unchanged, not sent again.
    assert (again.added, again.changed, again.unchanged, again.hashed, target.added) == (0, 0, 3, 3, [])


def test_a_file_that_cannot_be_read_keeps_its_document_and_the_run_goes_on(setup):
    """A file listed but gone (or unreadable) when it is read: a per-file error; its document stays."""
    folder, target, state = setup
    run_to_end(sync(FolderSource(folder), target, state))
    (folder / "b.md").write_text("beta, changed")
    (folder / "team" / "e.md").write_text("epsilon")

    class Vanishing(FolderSource):
        def entries(self):
            listed = list(super().entries())
            (folder / "b.md").unlink()  # gone between the listing and the read
            yield from listed

    summary = run_to_end(sync(Vanishing(folder), target, state))
    assert [(f["file"], f["code"]) for f in summary.failed] == [("b.md", "unreadable")]
    assert summary.added == 1 and summary.removed == 0 and ("default", "b.md") in target.docs


def test_a_file_that_failed_is_not_tried_again_until_it_changes(setup):
    folder, target, state = setup
    (folder / "bad.md").write_text("does not convert")
    target.fail_on.add("bad.md")
    first = run(folder, target, state)
    assert target.tries.count("bad.md") == 1 and first.failed_unchanged == 0
    assert [(f["file"], f["code"]) for f in first.failed] == [("bad.md", "conversion_failed")]

    target.tries.clear()
    events = []
    second = run_to_end(sync(FolderSource(folder), target, state), events.append)
    assert target.tries == []  # nothing sent: bad.md failed and has not changed; the rest is unchanged
    assert [(f["file"], f["code"], f["error"]) for f in second.failed] == [
        ("bad.md", "conversion_failed", "cannot convert")
    ]
    assert second.failed_unchanged == 1 and second.unchanged == 3
    assert [(e.file, e.stage, e.tried) for e in events] == [("bad.md", "failed", False)]
    assert "1 unchanged since they failed" in second.line()

    os.utime(folder / "bad.md", ns=(1, 1))  # touched, the same bytes: read, not sent
    third = run(folder, target, state)
    assert target.tries == [] and third.failed_unchanged == 1 and third.hashed == 1
    assert run(folder, target, state).hashed == 0  # the new stamp was kept

    (folder / "bad.md").write_text("does not convert, second version")
    fourth = run(folder, target, state)
    assert target.tries == ["bad.md"] and fourth.failed_unchanged == 0 and len(fourth.failed) == 1

    target.fail_on.clear()  # fixed, and changed again: indexed
    (folder / "bad.md").write_text("converts now")
    fifth = run(folder, target, state)
    assert fifth.added == 1 and fifth.failed == [] and ("default", "bad.md") in target.docs
    assert "failure" not in state.load()["bad.md"]


def test_a_changed_file_that_fails_keeps_its_document_and_is_not_retried(setup):
    folder, target, state = setup
    run(folder, target, state)
    indexed = target.docs[("default", "a.md")]
    (folder / "a.md").write_text("alpha, a version that does not convert")
    target.fail_on.add("a.md")
    target.tries.clear()
    run(folder, target, state)
    second = run(folder, target, state)
    assert target.tries == ["a.md"]  # the first of the two runs only
    assert second.failed_unchanged == 1 and target.docs[("default", "a.md")] == indexed

    (folder / "a.md").unlink()  # gone: the document this source wrote goes with it
    third = run(folder, target, state)
    assert third.removed == 1 and ("default", "a.md") not in target.docs and third.failed == []


def test_a_failure_that_may_pass_is_tried_again_every_run(setup):
    folder, target, state = setup
    (folder / "later.md").write_text("the worker was away")
    target.away_for.add("later.md")
    run(folder, target, state)
    second = run(folder, target, state)
    assert target.tries.count("later.md") == 2 and second.failed_unchanged == 0
    target.away_for.clear()
    assert run(folder, target, state).added == 1
