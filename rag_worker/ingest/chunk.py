"""DoclingDocument -> chunks sized in the embedder's own tokens, following the document's structure.

Docling's HybridChunker walks the document tree (sections, lists, tables), merges small neighbours that share
headings and splits what exceeds the budget. It counts with the embedder's tokenizer, so a chunk's budget is
exactly what the embedder sees. Each chunk keeps two texts: `text` (what users read and full-text search
indexes) and `embed_text` (headings + text, Docling's `contextualize`), which is what gets embedded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import semchunk
from docling_core.transforms.chunker.hierarchical_chunker import (
    ChunkingDocSerializer,
    ChunkingSerializerProvider,
)
from docling_core.transforms.chunker.hybrid_chunker import HybridChunker
from docling_core.transforms.chunker.tokenizer.huggingface import HuggingFaceTokenizer
from docling_core.transforms.serializer.markdown import MarkdownTableSerializer
from docling_core.types.doc import DoclingDocument, TableItem
from pydantic import PrivateAttr

from .locations import Locator


@dataclass
class Chunk:
    chunk_index: int
    text: str
    embed_text: str
    page: int | None
    headings: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


class _MarkdownTables(ChunkingSerializerProvider):
    """Tables as Markdown (header row repeated when a table must be split) rather than Docling's triplets:
    readable in a source panel and to the generating model alike."""

    def get_serializer(self, doc: DoclingDocument) -> ChunkingDocSerializer:
        return ChunkingDocSerializer(doc=doc, table_serializer=MarkdownTableSerializer())


class _HybridChunker(HybridChunker):
    """Docling's HybridChunker, splitting oversized text the same way (semchunk, the same token counter and
    longest-token bound) without what its `segment` does per call: `semchunk.chunkerify(tokenizer)` reads the
    whole vocabulary to find the longest token (~40 ms, every oversized chunk) and registers a new memoised
    counter in a module-level dict whose unbounded cache keeps every piece of text ever counted, so indexing
    memory grew with each split document. Here the bound is computed once and the cache lives for one call."""

    _longest_token: int | None = PrivateAttr(default=None)

    def segment(self, doc_chunk, available_length, doc_serializer):
        items = doc_chunk.meta.doc_items
        if (
            self.repeat_table_header
            and isinstance(doc_serializer, ChunkingDocSerializer)
            and len(items) == 1
            and isinstance(items[0], TableItem)
        ):
            return super().segment(doc_chunk, available_length, doc_serializer)  # tables: line by line
        tokenizer = self.tokenizer.get_tokenizer()
        if self._longest_token is None:
            self._longest_token = max(len(token) for token in tokenizer.get_vocab())
        longest = self._longest_token

        @lru_cache(maxsize=4096)
        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        split = semchunk.chunkerify(
            count, chunk_size=available_length, max_token_chars=longest, memoize=False
        )
        return list(split(doc_chunk.text))


class Chunker:
    def __init__(self, tokenizer, max_tokens: int = 256):
        """`tokenizer`: a Hugging Face tokenizer (the embedder's). `max_tokens`: the budget per chunk."""
        self.max_tokens = max_tokens
        self._chunker = _HybridChunker(
            tokenizer=HuggingFaceTokenizer(tokenizer=tokenizer, max_tokens=max_tokens),
            serializer_provider=_MarkdownTables(),
            merge_peers=True,
            repeat_table_header=True,
        )

    def chunk(self, doc: DoclingDocument) -> list[Chunk]:
        chunks: list[Chunk] = []
        fence: str | None = None  # the opening line of a code block the last chunk left open
        locator = Locator(doc)
        for raw in self._chunker.chunk(dl_doc=doc):
            if not raw.text.strip():
                continue
            # Inside a code block the first line's indentation is code; elsewhere a chunk is trimmed.
            text = raw.text.rstrip().lstrip("\n") if fence else raw.text.strip()
            text, fence = balance_fences(text, fence)
            headings = list(raw.meta.headings or [])
            pages = sorted({p.page_no for item in raw.meta.doc_items for p in (item.prov or [])})
            labels = sorted({str(item.label.value) for item in raw.meta.doc_items})
            metadata = {"headings": headings, "content_types": labels}
            if len(pages) > 1:
                metadata["pages"] = pages
            location = locator.locate(raw.meta.doc_items, text, headings, pages)
            if location:
                metadata["location"] = location
            chunks.append(
                Chunk(
                    chunk_index=len(chunks),
                    text=text,
                    embed_text=self._chunker.contextualize(chunk=raw),
                    page=pages[0] if pages else None,
                    headings=headings,
                    metadata=metadata,
                )
            )
        return chunks


# A fenced code block's opening or closing line (CommonMark: up to three spaces, three or more backticks or tildes).
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def balance_fences(text: str, open_fence: str | None) -> tuple[str, str | None]:
    """A chunk's text as Markdown that stands on its own, and the fence left open after it.

    The chunker splits a code block too long for one chunk into pieces: the first piece opens a fence it never
    closes, the middle ones have none and the last closes one it never opened, so on a card or in a prompt the
    code reads as prose and the text after it as code. `open_fence` is the opening line of a block the previous
    chunk left open: it is opened again at the start, and a block this text leaves open is closed at its end."""
    state = open_fence
    for line in text.split("\n"):
        match = _FENCE_RE.match(line)
        if match is None:
            continue
        marker, info = match.groups()
        if state is None:
            if not (marker[0] == "`" and "`" in info):  # a backtick fence's info string has no backtick
                state = line.strip()
        elif marker[0] == state[0] and len(marker) >= _run(state) and not info.strip():
            state = None
    head = f"{open_fence}\n" if open_fence else ""
    tail = f"\n{state[: _run(state)]}" if state else ""
    return head + text + tail, state


def _run(fence_line: str) -> int:
    """Length of the backtick or tilde run that opens `fence_line`."""
    return len(fence_line) - len(fence_line.lstrip(fence_line[0]))
