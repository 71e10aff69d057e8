"""DoclingDocument -> chunks sized in the embedder's own tokens, following the document's structure.

Docling's HybridChunker walks the document tree (sections, lists, tables), merges small neighbours that share
headings and splits what exceeds the budget. It counts with the embedder's tokenizer, so a chunk's budget is
exactly what the embedder sees. Each chunk keeps two texts: `text` (what users read and full-text search
indexes) and `embed_text` (headings + text, Docling's `contextualize`), which is what gets embedded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from docling_core.transforms.chunker.hierarchical_chunker import (
    ChunkingDocSerializer,
    ChunkingSerializerProvider,
)
from docling_core.transforms.chunker.hybrid_chunker import HybridChunker
from docling_core.transforms.chunker.tokenizer.huggingface import HuggingFaceTokenizer
from docling_core.transforms.serializer.markdown import MarkdownTableSerializer
from docling_core.types.doc import DoclingDocument


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


class Chunker:
    def __init__(self, tokenizer, max_tokens: int = 256):
        """`tokenizer`: a Hugging Face tokenizer (the embedder's). `max_tokens`: the budget per chunk."""
        self.max_tokens = max_tokens
        self._chunker = HybridChunker(
            tokenizer=HuggingFaceTokenizer(tokenizer=tokenizer, max_tokens=max_tokens),
            serializer_provider=_MarkdownTables(),
            merge_peers=True,
            repeat_table_header=True,
        )

    def chunk(self, doc: DoclingDocument) -> list[Chunk]:
        chunks: list[Chunk] = []
        for raw in self._chunker.chunk(dl_doc=doc):
            text = raw.text.strip()
            if not text:
                continue
            headings = list(raw.meta.headings or [])
            pages = sorted({p.page_no for item in raw.meta.doc_items for p in (item.prov or [])})
            labels = sorted({str(item.label.value) for item in raw.meta.doc_items})
            metadata = {"headings": headings, "content_types": labels}
            if len(pages) > 1:
                metadata["pages"] = pages
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
