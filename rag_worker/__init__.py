"""rag_worker: the stateless RAG service (retrieval, generation, ingestion)."""

__version__ = "0.1.0"
