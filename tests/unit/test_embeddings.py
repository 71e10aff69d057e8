"""The packaged embedder: shape, normalisation, order, caching and that it actually captures meaning."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rag_worker.bert_encoder import bfloat16_supported
from rag_worker.embeddings import Embedder, length_groups, model_identity
from rag_worker.errors import Unavailable
from rag_worker.settings import packaged_embedding_model


def test_identity_and_dimension(embedder):
    assert embedder.dim == 384
    assert embedder.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.tokenizer is not None


def test_documents_are_normalised_float32(embedder):
    vecs = embedder.embed_documents(["a short one", "a considerably longer sentence about something else"])
    assert vecs.dtype == np.float32 and vecs.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert embedder.embed_documents([]).shape == (0, 384)


def test_order_is_kept_despite_length_sorting(embedder):
    # Lengths deliberately out of order and more texts than one batch (batch_size=4 in the fixture).
    texts = [
        "The mitochondria is the powerhouse of the cell and produces most of its chemical energy.",
        "Cats.",
        "The quarterly tax filing deadline is the fifteenth of April for most individual taxpayers.",
        "Rain tomorrow.",
        "Python is a programming language.",
        "Ice melts at zero degrees Celsius under normal pressure.",
    ]
    together = embedder.embed_documents(texts)
    for i, text in enumerate(texts):
        alone = embedder.embed_documents([text])[0]
        assert float(alone @ together[i]) > 0.999, text


ENCODER_TEXTS = [
    "Cats.",
    "what is known about the role of T cells in autoimmune disease?",
    "The quarterly tax filing deadline is the fifteenth of April for most individual taxpayers.",
    "word " * 400,  # truncated to max_length
]
ENCODER_BATCHES = (ENCODER_TEXTS, ENCODER_TEXTS[1:2])  # a padded batch, and one text alone


@pytest.fixture(scope="module")
def float32_embedder():
    return Embedder(packaged_embedding_model(), batch_size=4, torch_threads=1, precision="float32")


@pytest.fixture(scope="module")
def model_vectors(float32_embedder):
    """Each of ENCODER_BATCHES' vectors from the model as transformers loads and runs it (float32)."""
    import torch
    from transformers import AutoModel

    emb = float32_embedder
    pristine = AutoModel.from_pretrained(emb.model_path, local_files_only=True).eval()
    out = []
    for batch in ENCODER_BATCHES:
        enc = emb._tok(batch, padding=True, truncation=True, max_length=emb.max_length, return_tensors="pt")
        with torch.inference_mode():
            hidden = pristine(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())
    return out


def test_fast_encoder_matches_the_transformers_forward(float32_embedder, model_vectors):
    # MiniLM runs through rag_worker/bert_encoder.py (its weights re-laid out); in float32 its vectors must be
    # those of the model as transformers loads and runs it, padded batch or not.
    assert float32_embedder._encoder is not None and float32_embedder.precision == "float32"
    for batch, expected in zip(ENCODER_BATCHES, model_vectors, strict=True):
        assert np.abs(float32_embedder._forward(list(batch)) - expected).max() < 1e-5


@pytest.mark.skipif(not bfloat16_supported(), reason="oneDNN cannot run bfloat16 products on this CPU")
def test_bfloat16_products_keep_the_models_similarities(float32_embedder, model_vectors):
    # EMBEDDING_PRECISION=bfloat16: the linear layers' products in bfloat16 (accumulated in float32). Each vector
    # stays the model's own to within rounding, and what the pipeline compares (the similarity of a question and
    # a passage, the thresholds calibrated on them) moves by thousandths, far inside any threshold's margin.
    fast = Embedder(packaged_embedding_model(), batch_size=4, torch_threads=1, precision="bfloat16")
    assert fast.precision == "bfloat16" and fast.describe()["precision"] == "bfloat16"
    questions = [
        "what is known about the role of T cells in autoimmune disease?",
        "when are taxes due?",
        "Cats.",
    ]
    passages = [
        "Regulatory T cells suppress autoreactive lymphocytes and their loss leads to autoimmunity.",
        "The quarterly tax filing deadline is the fifteenth of April for most individual taxpayers.",
        "Domestic cats sleep for twelve to sixteen hours a day.",
        "word " * 400,
    ]
    for batch, own in zip(ENCODER_BATCHES, model_vectors, strict=True):
        assert float(np.min(np.sum(fast._forward(list(batch)) * own, axis=1))) > 0.9995
    exact = float32_embedder.embed_documents(passages) @ float32_embedder.embed_documents(questions).T
    rounded = fast.embed_documents(passages) @ fast.embed_documents(questions).T
    assert np.abs(rounded - exact).max() < 0.005
    # The ranking of passages for each question is the model's.
    assert (rounded.argmax(axis=0) == exact.argmax(axis=0)).all()


def test_precision_is_chosen_from_the_cpu_or_the_setting(embedder, float32_embedder, monkeypatch):
    from rag_worker import bert_encoder
    from rag_worker.embeddings import wants_bfloat16
    from rag_worker.settings import Settings

    # The default (`auto`) uses bfloat16 products only where the CPU multiplies them in hardware.
    assert embedder.precision == ("bfloat16" if bert_encoder.bfloat16_fast() else "float32")
    assert float32_embedder.describe()["precision"] == "float32"
    monkeypatch.setattr(bert_encoder, "bfloat16_fast", lambda: False)
    monkeypatch.setattr("rag_worker.embeddings.bfloat16_fast", lambda: False)
    assert not wants_bfloat16("auto") and not wants_bfloat16("float32")
    assert wants_bfloat16("bfloat16") == bfloat16_supported()
    # Asked for bfloat16 where oneDNN cannot run it: float32, said in the log, not a worker that fails to start.
    monkeypatch.setattr("rag_worker.embeddings.bfloat16_supported", lambda: False)
    assert not wants_bfloat16("bfloat16")
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        wants_bfloat16("fp8")
    monkeypatch.setenv("EMBEDDING_PRECISION", "half")
    with pytest.raises(ValueError, match="EMBEDDING_PRECISION"):
        Settings()


def test_mixed_lengths_run_as_passes_of_similar_lengths():
    # Concurrent turns' answer sentences share a batch: a 12-token and a 60-token one are not padded together.
    assert length_groups([60, 12, 58, 13, 61]) == [[1, 3], [2, 0, 4]]
    assert length_groups([20, 21, 20]) == [
        [0, 2, 1]
    ]  # one pass when padding would cost less than another pass
    assert length_groups([5]) == [[0]] and length_groups([]) == []


def test_query_cache_returns_the_same_read_only_vector(embedder):
    first = embedder.embed_query("what is the refund policy?")
    second = embedder.embed_query("what is the refund policy?")
    assert second is first
    assert not first.flags.writeable
    assert float(first @ embedder.embed_documents(["what is the refund policy?"])[0]) > 0.999


def test_recurring_texts_are_embedded_once_across_calls(embedder):
    cached = Embedder(packaged_embedding_model(), batch_size=4, torch_threads=1, text_cache_size=3)
    asked: list[str] = []
    inner = cached.embed_documents

    def counting(texts):
        asked.extend(texts)
        return inner(texts)

    cached.embed_documents = counting
    a, b, c, d = "Refunds take ten days.", "The office opens at nine.", "Parking is free.", "Badges are blue."
    first = cached.embed_cached([a, b, a])
    assert asked == [a, b]  # a repeated text is embedded once
    second = cached.embed_cached([b, c, a])
    assert asked == [a, b, c]  # only the new one
    assert np.allclose(second[2], first[0]) and np.allclose(second[0], first[1])
    assert float(second[1] @ embedder.embed_documents([c])[0]) > 0.999
    cached.embed_cached([d])  # the cache holds 3: the least recently used (b) goes
    cached.embed_cached([b])
    assert asked == [a, b, c, d, b]
    off = Embedder(packaged_embedding_model(), batch_size=4, torch_threads=1, text_cache_size=0)
    assert float(off.embed_cached([a])[0] @ first[0]) > 0.999


def test_similar_sentences_score_higher_than_unrelated(embedder):
    q = embedder.embed_query("How many vacation days do employees get?")
    docs = embedder.embed_documents(
        ["Staff are entitled to 25 days of paid annual leave.", "The server rack uses 48V DC power supplies."]
    )
    related, unrelated = docs @ q
    assert related > unrelated + 0.2


def test_long_text_is_truncated_not_rejected(embedder):
    vec = embedder.embed_documents(["word " * 5000])
    assert vec.shape == (1, 384) and np.isfinite(vec).all()
    assert embedder.count_tokens("word " * 300) == 300  # counting never truncates


def test_concurrent_calls_are_safe(embedder):
    errors: list[BaseException] = []
    expected = embedder.embed_documents(["concurrency check sentence"])[0]

    def work(n: int) -> None:
        try:
            for _ in range(3):
                embedder.count_tokens("some text " * n)
                got = embedder.embed_documents(["concurrency check sentence", "other " * n])[0]
                assert float(got @ expected) > 0.999
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in (5, 50, 300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_identity_of_hub_ids_and_cache_dirs(tmp_path):
    assert model_identity("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    snap = tmp_path / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert model_identity(str(snap)) == "BAAI/bge-small-en-v1.5"
    plain = tmp_path / "my-encoder" / "model"
    plain.mkdir(parents=True)
    assert model_identity(str(plain)) == "my-encoder"


def test_missing_model_is_a_clear_503(tmp_path):
    with pytest.raises(Unavailable) as info:
        Embedder(str(tmp_path / "nowhere"))
    assert info.value.status == 503 and "nowhere" in info.value.message


def test_bfloat16_products_run_on_a_few_row_counts():
    # oneDNN builds a kernel per row count (batch x longest text) it meets, about 5 ms a pass the first time; the
    # rows are padded to buckets so a running worker meets a few dozen counts, not thousands, at most an eighth
    # more rows computed.
    from rag_worker.bert_encoder import row_bucket

    buckets = {row_bucket(rows) for rows in range(1, 8193)}
    assert len(buckets) <= 80
    for rows in range(1, 8193):
        bucket = row_bucket(rows)
        assert rows <= bucket <= max(16, rows + rows // 8)
        assert row_bucket(bucket) == bucket
