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
