"""Chunking on the embedder's tokenizer: budgets, headings, tables, pages."""

from __future__ import annotations

import pytest

from rag_worker.ingest.chunk import Chunker
from rag_worker.ingest.convert import Converter
from tests.servers import SHARED, needs_shared

DOCLING = SHARED / "fixtures" / "docling" / "sources"
pytestmark = needs_shared("fixtures/docling/sources")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rag_worker.settings import packaged_embedding_model

    return AutoTokenizer.from_pretrained(packaged_embedding_model(), local_files_only=True)


@pytest.fixture(scope="module")
def converter():
    return Converter()


@pytest.mark.parametrize("name", ["normal_4pages.pdf", "wiki_duck.html", "lorem_ipsum.docx", "xlsx_01.xlsx"])
def test_every_chunk_fits_the_token_budget(tokenizer, converter, name):
    chunks = Chunker(tokenizer, max_tokens=128).chunk(converter.convert(DOCLING / name).document)
    assert len(chunks) > 1
    for chunk in chunks:
        # what gets embedded (headings + text) fits, so the embedder never truncates a chunk
        assert len(tokenizer(chunk.embed_text, add_special_tokens=False)["input_ids"]) <= 128
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))


def test_headings_travel_with_each_chunk(tokenizer, converter):
    chunks = Chunker(tokenizer, 256).chunk(converter.convert(DOCLING / "unit_test_headers.docx").document)
    deep = [c for c in chunks if c.headings[-1:] == ["Section 1.1"]]
    assert deep, [c.headings for c in chunks]
    chunk = deep[0]
    assert chunk.metadata["headings"] == chunk.headings
    assert chunk.embed_text.startswith("\n".join(chunk.headings))  # embedded with its context
    assert not chunk.text.startswith(chunk.headings[0])  # what users read is the passage itself


def test_tables_are_kept_whole_as_markdown(tokenizer, converter):
    chunks = Chunker(tokenizer, 256).chunk(converter.convert(DOCLING / "word_tables.docx").document)
    table_chunks = [c for c in chunks if "table" in c.metadata["content_types"]]
    assert table_chunks
    first = next(c for c in table_chunks if "Header 0.0" in c.text)
    # the whole 3x3 uniform table, header and every cell, in one chunk
    for cell in ["Header 0.2", "Cell 1.0", "Cell 2.2"]:
        assert cell in first.text
    assert "|" in first.text


def test_a_table_too_big_for_one_chunk_repeats_its_header(tokenizer, converter, tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text("name,colour\n" + "\n".join(f"item number {n},shade {n}" for n in range(120)))
    chunks = Chunker(tokenizer, 96).chunk(converter.convert(path).document)
    assert len(chunks) > 1
    assert all("colour" in c.text for c in chunks)
    text = "\n".join(c.text for c in chunks)
    assert "item number 0" in text and "item number 119" in text


def test_pdf_chunks_carry_their_page(tokenizer, converter):
    chunks = Chunker(tokenizer, 256).chunk(converter.convert(DOCLING / "multi_page.pdf").document)
    pages = [c.page for c in chunks]
    assert None not in pages
    assert pages == sorted(pages)
    assert set(pages) == {1, 2, 3, 4, 5}


def test_splitting_long_text_matches_docling_and_keeps_nothing_per_document(tokenizer, converter):
    """Oversized passages split exactly as Docling's own HybridChunker splits them, without leaving a cache of
    their text behind (Docling's path registers one per split in a module-level dict: memory grew per file)."""
    import semchunk.semchunk as registry
    from docling_core.transforms.chunker.hybrid_chunker import HybridChunker

    ours = Chunker(tokenizer, 64)
    docling = Chunker(tokenizer, 64)
    docling._chunker = HybridChunker(
        tokenizer=ours._chunker.tokenizer,
        serializer_provider=ours._chunker.serializer_provider,
        merge_peers=True,
        repeat_table_header=True,
    )
    names = ["lorem_ipsum.docx", "wiki_duck.html", "normal_4pages.pdf"]
    documents = [converter.convert(DOCLING / name).document for name in names]
    before = len(registry._memoized_token_counters)
    produced = [[(c.text, c.embed_text) for c in ours.chunk(doc)] for doc in documents]
    assert len(registry._memoized_token_counters) == before  # nothing kept per split
    expected = [[(c.text, c.embed_text) for c in docling.chunk(doc)] for doc in documents]
    assert produced == expected
    assert sum(len(p) for p in produced) > 3 * len(names)  # the passages were split
