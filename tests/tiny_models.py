"""Tiny, randomly initialised models built on disk (no download), for plumbing tests of optional model paths."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def build_cross_encoder(path: Path, num_labels: int = 1) -> Path:
    """A 2-layer BERT sequence classifier with MiniLM's tokenizer beside it: loads like any cross-encoder."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from rag_worker.settings import packaged_embedding_model

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=num_labels,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    source = Path(packaged_embedding_model())
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, path / name)
    return path
