"""A chunk's row: the table's layout, the row checks and embedding before a write, and the packed hit column.

A hit's fields but its text are also packed into one JSON column, `hit` (PACKED), which the searches read instead
of the seven columns (as Lucene keeps a document's stored fields together). A Lance read by row id pays per column
per row, and a column that is constant across a file (`dataset` in a one-dataset index) decodes a whole page per
row: at 1M chunks, 30 hits' six columns cost several ms where the one column costs about one, and the id column
half a millisecond more (docs/benchmarks.md, "Fifth round" and "Ninth round"). The separate columns stay for
filters, listings and older readers. Tables made before the column existed lack it and are read column by column;
in tables made before the id joined it (their marker lacks PACKED_ID) the id is read from its column
(`Catalog.hit_columns`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..errors import BadRequest
from ..names import check_filename, check_name
from .filters import check_document_id, doc_key

if TYPE_CHECKING:  # pragma: no cover
    from lancedb.table import LanceTable

    from ..embeddings import Embedder

MARKER_KEY = b"rag_worker.marker"  # schema metadata key of the table's embedder marker
HIT_COLUMNS = ["id", "document_id", "filename", "dataset", "page", "chunk_index", "text", "metadata"]
PACKED = "hit"
PACKED_ID = "packed_id"  # marker key: every row's packed column holds its id
PACKED_FIELDS = ("id", "document_id", "filename", "dataset", "page", "chunk_index", "metadata")
PACKED_COLUMNS = ["text", PACKED]
# The chunk's passage sentences as the grounding check splits them (pipeline.grounding.sentences), and their
# vectors, embedded at ingestion so that a turn embeds only its answer's sentences (issue 31): float16, row-major,
# one `dim`-wide row per sentence. Null in rows written without them (SENTENCE_VECTORS=off); absent from tables
# made before them (marker `sentences` false): the check embeds those chunks' sentences as it reads them.
SENTENCES = "sentences"
SENTENCE_VECTORS = "sentence_vectors"
SENTENCE_COLUMNS = [SENTENCES, SENTENCE_VECTORS]
# The full-text tokenizer: English stemming is worth +0.03 nDCG@10 of the FTS leg on SciFact, dropping stop words
# a hair (docs/benchmarks.md). Changing it only affects tables created afterwards.
FTS_CONFIG = {
    "language": "English",
    "stem": True,
    "remove_stop_words": True,
    "lower_case": True,
    "ascii_folding": True,
}


@dataclass
class Hit:
    id: str
    document_id: str
    filename: str
    dataset: str
    page: int | None
    chunk_index: int
    text: str
    metadata: dict
    index: str
    score: float = 0.0  # the fused score (fusion.FUSIONS); only its order means anything
    # Cosine similarity of query and chunk vectors; in hybrid mode set for the FTS leg's hits too (from the
    # stored vector), vector_rank staying None for a chunk the vector leg did not return.
    vector_score: float | None = None
    fts_score: float | None = None  # BM25 score of the chunk for the query
    vector_rank: int | None = None  # 1-based
    fts_rank: int | None = None  # 1-based
    rerank_score: float | None = None  # set by the pipeline's rerank stage when a cross-encoder runs
    # The chunk's stored vector, when the search read it (so a turn never reads or embeds it again); never
    # serialised.
    vector: np.ndarray | None = field(default=None, repr=False, compare=False)
    # Where the search found the row in its table's version (Lance's row address); never serialised. The legs
    # and the fusion key rows by it and break exact ties by it, so that a hybrid search need read no column but
    # the scores until the fused top is known.
    row_id: int | None = field(default=None, repr=False, compare=False)
    # {sentence: vector} stored with the chunk, when the read asked for them (`neighbours_of`); never serialised.
    sentence_vectors: dict | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in UNSERIALISED}


UNSERIALISED = ("vector", "row_id", "sentence_vectors")


def chunk_id(dataset: str, filename: str, document_id: str, chunk_index: int) -> str:
    """A chunk's id: two files with identical bytes (same document_id) still get distinct ids."""
    raw = f"{dataset}\x00{filename}\x00{document_id}\x00{int(chunk_index)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def table_schema(dim: int, marker: dict) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("doc_key", pa.string(), nullable=False),
            pa.field("document_id", pa.string(), nullable=False),
            pa.field("filename", pa.string(), nullable=False),
            pa.field("dataset", pa.string(), nullable=False),
            pa.field("page", pa.int32()),
            pa.field("chunk_index", pa.int32(), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            pa.field("metadata", pa.string()),
            pa.field("file_bytes", pa.int64()),
            pa.field("indexed_at", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim)),
            pa.field(PACKED, pa.string()),
            pa.field(SENTENCES, pa.list_(pa.string())),
            pa.field(SENTENCE_VECTORS, pa.binary()),
        ],
        metadata={MARKER_KEY: json.dumps(marker).encode()},
    )


def prepare(rows: list[dict], embedder: Embedder, marker: dict, *, sentences: bool = True) -> pa.Table:
    """Rows validated, the ones without a vector embedded, laid out as `table_schema`; nothing is written here.
    With `sentences`, each row's passage sentences are embedded too (never taken from the caller's rows)."""
    clean = [_checked(n, row) for n, row in enumerate(rows)]
    ids = [r["id"] for r in clean]
    if len(set(ids)) != len(ids):
        raise BadRequest("rows carry duplicate chunk ids", code="bad_rows")
    dim = embedder.dim
    vectors, embedded = _vectors(rows, embedder)
    schema = table_schema(dim, marker)
    columns = {
        name: [r[name] for r in clean] for name in schema.names if name not in ("vector", *SENTENCE_COLUMNS)
    }
    columns["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
    texts = [r["text"] for r in clean]
    columns[SENTENCES], columns[SENTENCE_VECTORS] = (
        sentence_columns(texts, embedder, known=embedded)
        if sentences
        else ([None] * len(texts), [None] * len(texts))
    )
    return pa.table(columns, schema=schema)


def chunk_sentences(text: str) -> list[str]:
    """The passage sentences of a chunk's text, as the grounding check splits what the generator read (a chunk
    read with its neighbours, joined by blank lines, splits into the same sentences)."""
    from ..pipeline.grounding.sentences import passage_sentences  # the check's own splitting, not a copy

    return list(dict.fromkeys(p.text for p in passage_sentences("", text)))


def sentence_columns(
    texts: list[str], embedder: Embedder, known: dict[str, np.ndarray] | None = None
) -> tuple[list[list[str]], list[bytes]]:
    """(sentences, their vectors as float16 bytes) per chunk text; every distinct sentence embedded once, with
    `embed_documents` (what the check's `embed_cached` runs), so a stored vector is the one the check would make.
    `known`: vectors this write embedded already ({text: vector}; a one-sentence chunk embedded as it is)."""
    known = known or {}
    per_chunk = [chunk_sentences(t) for t in texts]
    distinct = list(dict.fromkeys(s for sents in per_chunk for s in sents if s not in known))
    vecs = dict(known)
    if distinct:
        vecs.update(zip(distinct, embedder.embed_documents(distinct), strict=True))
    dim = embedder.dim
    blobs = [
        np.asarray([vecs[s] for s in sents], dtype=np.float16).reshape(-1, dim).tobytes()
        for sents in per_chunk
    ]
    return per_chunk, blobs


def decode_sentences(sentences: list[str] | None, blob: bytes | None, dim: int) -> dict[str, np.ndarray]:
    """{sentence: float32 vector} of one stored row; {} for a row without them or one that does not add up."""
    if not sentences or not blob or len(blob) != len(sentences) * dim * 2:
        return {}
    vecs = np.frombuffer(blob, dtype=np.float16).reshape(len(sentences), dim).astype(np.float32)
    vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-9)  # unit again after the rounding
    return dict(zip(sentences, vecs, strict=True))


def _checked(n: int, row: object) -> dict:
    """Row `n` checked and laid out as the table's columns but the vector."""
    if not isinstance(row, dict):
        raise BadRequest(f"row {n} is not an object", code="bad_rows")
    dataset = check_name(row.get("dataset"), "dataset")
    filename = check_filename(row.get("filename"))
    document_id = check_document_id(row.get("document_id"))
    chunk_index = row.get("chunk_index")
    text = row.get("text")
    page = row.get("page")
    if not isinstance(chunk_index, int) or isinstance(chunk_index, bool) or chunk_index < 0:
        raise BadRequest(f"row {n}: chunk_index must be a non-negative integer", code="bad_rows")
    if not isinstance(text, str):
        raise BadRequest(f"row {n}: text must be a string", code="bad_rows")
    if page is not None and (not isinstance(page, int) or isinstance(page, bool)):
        raise BadRequest(f"row {n}: page must be an integer or null", code="bad_rows")
    metadata = json.dumps(row.get("metadata") or {}, ensure_ascii=False, default=str)
    row_id = str(row.get("id") or chunk_id(dataset, filename, document_id, chunk_index))
    return {
        "id": row_id,
        "doc_key": doc_key(dataset, filename),
        "document_id": document_id,
        "filename": filename,
        "dataset": dataset,
        "page": page,
        "chunk_index": chunk_index,
        "text": text,
        "metadata": metadata,
        "file_bytes": int(row.get("file_bytes") or 0),
        "indexed_at": str(row.get("indexed_at") or ""),
        PACKED: pack(row_id, document_id, filename, dataset, page, chunk_index, metadata),
    }


def _vectors(rows: list[dict], embedder: Embedder) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows' vectors: those given, checked, and the others embedded (from `embed_text`, else the text); and
    {text: vector} of those embedded here (a caller's vector never stands for a text)."""
    dim = embedder.dim
    vectors = np.zeros((len(rows), dim), dtype=np.float32)
    missing = [i for i, row in enumerate(rows) if row.get("vector") is None]
    for i, row in enumerate(rows):
        if row.get("vector") is not None:
            vec = np.asarray(row["vector"], dtype=np.float32)
            if vec.shape != (dim,) or not np.all(np.isfinite(vec)):
                raise BadRequest(f"row {i}: vector must have {dim} finite values", code="bad_rows")
            vectors[i] = vec
    embedded: dict[str, np.ndarray] = {}
    if missing:
        texts = [rows[i].get("embed_text") or rows[i]["text"] for i in missing]
        vectors[missing] = embedder.embed_documents(texts)
        embedded = dict(zip(texts, vectors[missing], strict=True))
    return vectors, embedded


def arrow_rows(data: pa.Table) -> list[dict]:
    """Arrow rows as dicts, a `vector` column as numpy rows (a Python list of floats per row costs more CPU than
    the search itself)."""
    if "vector" not in data.column_names:
        return data.to_pylist()
    column = data.column("vector").combine_chunks()
    if column.null_count or not pa.types.is_fixed_size_list(column.type):
        return data.to_pylist()
    rows = data.drop_columns(["vector"]).to_pylist()
    if not rows:
        return rows
    vectors = column.flatten().to_numpy(zero_copy_only=False).reshape(len(rows), -1)
    for row, vec in zip(rows, vectors, strict=True):
        row["vector"] = vec
    return rows


def pack(
    id: str, document_id: str, filename: str, dataset: str, page: int | None, chunk_index: int, metadata: str
) -> str:
    """The packed column's value: the fields as JSON, `metadata` (already JSON) spliced in, not encoded twice."""
    head = json.dumps(
        {
            "id": id,
            "document_id": document_id,
            "filename": filename,
            "dataset": dataset,
            "page": page,
            "chunk_index": chunk_index,
        },
        ensure_ascii=False,
    )
    return f'{head[:-1]}, "metadata": {metadata}}}'


def packed_column(data: pa.Table) -> pa.Array:
    """The packed column for rows given column by column (read back from a table made before it, or written in
    bulk by the latency benchmark)."""
    packed = []
    for row in data.select(list(PACKED_FIELDS)).to_pylist():
        try:
            metadata = json.dumps(json.loads(row["metadata"] or "{}"), ensure_ascii=False)
        except ValueError:
            metadata = "{}"
        packed.append(pack(**{**row, "metadata": metadata}))
    return pa.array(packed, pa.string())


def to_hit(index: str, row: dict) -> Hit:
    """A Hit of `index` from a row as a search or scan reads it: its packed column, or its columns one by one."""
    packed = row.get(PACKED)
    if packed:  # the fields from the packed column (a table made before it has them each in its own)
        row = {**row, **json.loads(packed)}
        metadata = row["metadata"]
    else:
        try:
            metadata = json.loads(row["metadata"]) if row.get("metadata") else {}
        except ValueError:
            metadata = {}
    # A slim leg's row has its row id and scores only; `search.materialise` fills in the rest for the hits that
    # are kept.
    return Hit(
        id=row.get("id", ""),
        document_id=row.get("document_id", ""),
        filename=row.get("filename", ""),
        dataset=row.get("dataset", ""),
        page=row.get("page"),
        chunk_index=int(row.get("chunk_index", 0)),
        text=row.get("text", ""),
        metadata=metadata if isinstance(metadata, dict) else {},
        index=index,
        row_id=row.get("_rowid"),
    )


def scan_arrow(table: LanceTable, where: str | None, columns: list[str]) -> pa.Table:
    """These columns of every row matching `where` (all rows: None), read through LanceDB's query layer."""
    q = table.search().select(columns)
    if where:
        q = q.where(where)
    return q.limit(None).to_arrow()


def scan(table: LanceTable, where: str | None, columns: list[str]) -> list[dict]:
    """`scan_arrow` as dicts."""
    return scan_arrow(table, where, columns).to_pylist()
