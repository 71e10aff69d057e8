"""Rebuilding an index (`index_folder(..., rebuild=True)`, behind `POST /index` and the CLI's --rebuild) on a real
LanceDB store with the real embedder, stepped one event at a time so that what a reader sees mid-rebuild is
checked without any timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_worker.errors import ApiError
from rag_worker.ingest.document import ingest_file, uploads_path
from rag_worker.ingest.folder import index_folder
from rag_worker.ingest.overviews import load_overviews
from rag_worker.ingest.records import BatchDone, Progress
from rag_worker.ingest.removal import delete_document
from rag_worker.services import Services
from rag_worker.settings import Settings
from tests.corpus import build_foreign_index


@pytest.fixture(scope="module")
def embedder():
    from rag_worker.embeddings import Embedder
    from rag_worker.settings import packaged_embedding_model

    return Embedder(packaged_embedding_model(), batch_size=2, max_length=256, torch_threads=1)


def make_services(root: Path, embedder) -> Services:
    svc = Services(
        Settings(
            INDEX_STORE=str(root / "store"),
            UPLOADS_DIR=str(root / "uploads"),
            OVERVIEW_SUMMARIES="off",
            LLM_BACKEND="local",
            INGEST_BATCH_CHUNKS=8,  # several commits per folder: a rebuild has a "meanwhile"
        )
    )
    svc.__dict__["embedder"] = (
        embedder  # the module's embedder: loading it per test is slow on a shared machine
    )
    return svc


@pytest.fixture(scope="module")
def services(tmp_path_factory, embedder) -> Iterator[Services]:
    """One store and one conversion child for the module (a child costs seconds of CPU to start); each test
    works on an index of its own name."""
    svc = make_services(tmp_path_factory.mktemp("rebuild"), embedder)
    yield svc
    svc.close()  # its conversion child (~450 MB) would otherwise live until a garbage collection


def uploads_of(services: Services, index: str) -> Path:
    """The index's folder of uploaded originals (what `POST /index` rebuilds from)."""
    return services.settings.uploads_dir / index


def write(folder: Path, rel: str, text: str) -> Path:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def run(services, index, folder, **kw) -> BatchDone:
    events = list(index_folder(services, index, folder, **kw))
    done = events[-1]
    assert isinstance(done, BatchDone), events
    return done


def own_indexes(services, index: str) -> list[str]:
    """The indexes the store lists that are `index` or named after it (a staged table must not be one)."""
    return [i for i in services.store.indexes() if i.startswith(index)]


def names(services, index) -> set[tuple[str, str]]:
    return {(d["dataset"], d["filename"]) for d in services.store.list_documents(index)}


def found(services, index, word) -> set[str]:
    return {h.filename for h in services.store.search(index, word, mode="fts", limit=10)}


def many_files(folder: Path, n: int) -> None:
    for i in range(n):
        write(folder, f"bulk/file{i:02d}.md", f"Bulk file {i} is about the zebrafish{i:02d} experiment.")


def test_searches_answer_from_the_old_table_until_the_rebuild_is_complete(services, tmp_path):
    folder = tmp_path / "src"
    write(folder, "guide.md", "The old guide recommends the marmalade procedure.")
    many_files(folder, 12)
    assert run(services, "docs", folder).documents == 13
    before = names(services, "docs")
    write(folder, "guide.md", "The new guide recommends the quince procedure.")

    events = index_folder(services, "docs", folder, rebuild=True)
    for event in events:
        if isinstance(event, Progress) and event.stage == "indexed":
            break  # some files are in the new table now, the rebuild is far from done
    else:
        raise AssertionError("no file was indexed")
    assert names(services, "docs") == before
    assert found(services, "docs", "marmalade") == {"guide.md"}
    assert found(services, "docs", "quince") == set()
    assert own_indexes(services, "docs") == ["docs"]  # the table being built is no index of its own

    done = list(events)[-1]
    assert isinstance(done, BatchDone) and done.documents == 13 and not done.failed
    assert names(services, "docs") == before
    assert found(services, "docs", "quince") == {"guide.md"}
    assert found(services, "docs", "marmalade") == set()
    assert own_indexes(services, "docs") == ["docs"]


def test_a_rebuild_keeps_documents_whose_file_is_not_in_the_folder_unless_pruned(services, tmp_path):
    cli_folder = tmp_path / "cli"  # the demo index: built by the CLI from a folder that is gone afterwards
    write(cli_folder, "docs/backup.md", "Back up the data with the pelican script every night.")
    write(cli_folder, "docs/restore.md", "Restore from the walrus archive.")
    assert run(services, "demo", cli_folder).documents == 2
    uploads = uploads_of(services, "demo")
    write(uploads, "docs/extra.md", "An uploaded note about the narwhal.")

    done = run(services, "demo", uploads, rebuild=True)
    assert done.documents == 1 and done.kept == 2 and done.removed == 0 and not done.failed
    assert names(services, "demo") == {("docs", "backup.md"), ("docs", "restore.md"), ("docs", "extra.md")}
    assert found(services, "demo", "pelican") == {"backup.md"}
    assert found(services, "demo", "narwhal") == {"extra.md"}
    kept = {(e["dataset"], e["filename"]) for e in load_overviews(services.settings, "demo")}
    assert kept == names(services, "demo")  # triage still knows every document

    done = run(services, "demo", uploads, rebuild=True, prune=True)
    assert done.kept == 0 and done.removed > 0
    assert names(services, "demo") == {("docs", "extra.md")}
    assert found(services, "demo", "pelican") == set()


def test_a_file_that_fails_in_a_rebuild_keeps_its_indexed_rows(services, tmp_path):
    folder = tmp_path / "src"
    write(folder, "report.md", "The report covers the albatross census.")
    assert run(services, "fails", folder).documents == 1
    (folder / "report.md").write_bytes(b"")  # now unreadable: no text at all

    done = run(services, "fails", folder, rebuild=True)
    assert [f["file"] for f in done.failed] == ["report.md"]
    assert found(services, "fails", "albatross") == {"report.md"}


def test_a_dot_file_accepted_at_upload_is_indexed_by_a_rebuild(services, tmp_path):
    folder = uploads_of(services, "dots")
    write(folder, "default/.notes.md", "Private notes about the okapi.")
    write(folder, "default/.DS_Store", "\x00\x01 finder junk")
    write(folder, "default/visible.md", "A visible file about the tapir.")
    write(folder, ".hidden/ignored.md", "Never a dataset.")
    done = run(services, "dots", folder, rebuild=True)
    assert not done.failed, done.failed  # .DS_Store is passed over quietly, as no upload could make it
    assert names(services, "dots") == {("default", ".notes.md"), ("default", "visible.md")}
    assert found(services, "dots", "okapi") == {".notes.md"}


def test_a_rebuild_stopped_half_way_leaves_the_index_as_it_was(services, tmp_path):
    folder = tmp_path / "src"
    many_files(folder, 10)
    assert run(services, "half", folder).documents == 10
    before = names(services, "half")
    for i in range(10):
        write(folder, f"bulk/file{i:02d}.md", f"Bulk file {i} is about the axolotl{i:02d} experiment.")

    events = index_folder(services, "half", folder, rebuild=True)
    for event in events:
        if isinstance(event, Progress) and event.stage == "indexed":
            break
    events.close()  # the client went away, or the process is stopping
    assert names(services, "half") == before
    assert found(services, "half", "zebrafish03") == {"file03.md"}
    assert services.store.staged_tables("half") == []  # the unfinished table is gone


def test_a_crashed_rebuild_leaves_a_table_nobody_sees_and_the_next_rebuild_drops_it(services, tmp_path):
    folder = tmp_path / "src"
    write(folder, "a.md", "The first text is about the capybara.")
    assert run(services, "crash", folder).documents == 1
    # What a process killed mid-rebuild leaves behind: a half-built table that was never swapped in.
    leftover = services.store.new_staged("crash")
    services.store.add_chunks(
        leftover,
        [
            {
                "document_id": "b" * 64,
                "filename": "b.md",
                "dataset": "default",
                "chunk_index": 0,
                "text": "ibis",
            }
        ],
    )
    assert own_indexes(services, "crash") == ["crash"]  # the leftover table is no index
    assert names(services, "crash") == {("default", "a.md")}
    assert found(services, "crash", "ibis") == set()

    run(services, "crash", folder, rebuild=True)
    assert services.store.staged_tables("crash") == []
    assert names(services, "crash") == {("default", "a.md")}


def test_uploads_and_deletes_made_during_a_rebuild_survive_the_swap(services, tmp_path):
    folder = uploads_of(services, "live")
    many_files(folder, 12)
    assert run(services, "live", folder).documents == 12

    events = index_folder(services, "live", folder, rebuild=True)
    for event in events:
        if isinstance(event, Progress) and event.stage == "indexed" and event.done >= 1:
            break
    # An upload of a new file, a replacement of a file already rebuilt, and a delete, all while it runs.
    incoming = tmp_path / "incoming.md"
    incoming.write_text("A late upload about the pangolin.", encoding="utf-8")
    ingest_file(
        services,
        "live",
        "bulk",
        incoming,
        "late.md",
        keep_at=uploads_path(services, "live", "bulk", "late.md"),
    )
    first = sorted(f for d, f in names(services, "live") if f.startswith("file"))[0]
    replacement = tmp_path / "replacement.md"
    replacement.write_text("The replaced file is about the wombat now.", encoding="utf-8")
    ingest_file(
        services,
        "live",
        "bulk",
        replacement,
        first,
        keep_at=uploads_path(services, "live", "bulk", first),
    )
    delete_document(services, "live", "bulk", "file11.md")
    done = list(events)[-1]
    assert isinstance(done, BatchDone)

    listed = names(services, "live")
    assert ("bulk", "late.md") in listed and ("bulk", "file11.md") not in listed
    assert len(listed) == 12
    assert found(services, "live", "pangolin") == {"late.md"}
    assert found(services, "live", "wombat") == {first}
    assert found(services, "live", "zebrafish11") == set()


def test_a_second_rebuild_of_the_same_index_is_refused_while_one_runs(services, tmp_path):
    folder = tmp_path / "src"
    many_files(folder, 10)
    run(services, "busy", folder)
    first = index_folder(services, "busy", folder, rebuild=True)
    next(first)
    with pytest.raises(ApiError) as err:
        list(index_folder(services, "busy", folder, rebuild=True))
    assert err.value.status == 409 and err.value.code == "busy"
    assert isinstance(list(first)[-1], BatchDone)


def test_a_rebuild_with_another_embedder_embeds_the_kept_documents_again(services, tmp_path):
    build_foreign_index(services.settings.lancedb_dir, "foreign")  # 8-dim vectors of another model, old.txt
    with pytest.raises(ApiError) as err:
        services.store.search("foreign", "old text")
    assert err.value.code == "embedder_mismatch"
    folder = uploads_of(services, "foreign")
    write(folder, "default/new.md", "A new file about the quokka.")

    done = run(services, "foreign", folder, rebuild=True)
    assert done.kept == 1 and done.documents == 1
    assert names(services, "foreign") == {("default", "old.txt"), ("default", "new.md")}
    hits = services.store.search("foreign", "old text", mode="vector", limit=2)
    assert hits[0].filename == "old.txt" and hits[0].vector_score > 0.9


def test_closing_the_services_stops_their_conversion_child(tmp_path, embedder):
    services = make_services(tmp_path, embedder)
    services.converter.convert(write(tmp_path, "a.md", "A note about the heron."))  # starts the child
    proc = services.converter.sandbox._proc
    assert proc is not None and proc.poll() is None
    services.close()  # what a test or a shutting-down process calls: the child must not linger
    assert proc.wait(timeout=60) is not None
    services.close()  # twice is harmless
