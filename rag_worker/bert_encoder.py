"""A BERT encoder's forward pass as a dozen torch calls per layer, without transformers' module wrappers.

MiniLM-L6 on a 20-token query spends about a fifth of its forward pass in transformers' Python (module calls,
hooks, mask preparation, output objects), not in arithmetic; a turn embeds its query and its answer's sentences,
so that overhead was paid on every RAG turn (docs/benchmarks.md, "Sixth round"). The same weights, the same
operations in the same order: the hidden states match the model's own forward (tests/unit/test_embeddings.py).

Only plain BERT encoders qualify (absolute positions, exact GELU, no decoder parts); any other model keeps the
transformers forward (`BertEncoder.of` returns None).

`bfloat16=True` runs the linear layers (nine tenths of a short pass's arithmetic) as bfloat16 matrix products on
weights packed once for oneDNN, accumulating in float32; everything else (embeddings, attention, layer norms,
GELU, pooling) stays float32. On a CPU with AMX or AVX-512 BF16 a query's pass takes about half the time, and a
similarity moves by at most a few thousandths (docs/benchmarks.md, "Tenth round"); `EMBEDDING_PRECISION` picks it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _Linear:
    weight: object  # (out, in), stored transposed: see `_gemm_layout`
    bias: object
    # The weight in bfloat16, packed for oneDNN once (`_packed`); None: float32 products.
    packed: object = None


@dataclass(frozen=True)
class _Layer:
    qkv: _Linear  # the query, key and value projections in one matrix: one matmul instead of three
    attn_out: _Linear
    attn_norm: object  # nn.LayerNorm modules: their weights read, not their __call__
    intermediate: _Linear
    out: _Linear
    out_norm: object


def _gemm_layout(weight):
    """`weight` (out, in) as a view of its contiguous transpose: `F.linear` then hands MKL the (in, out) matrix it
    multiplies by without a transposed read, a third faster for the few rows of a query (same values, same sums)."""
    return weight.detach().t().contiguous().t()


def _relaid(*linears) -> _Linear:
    """One `_Linear` for `linears` stacked (query, key, value: one matmul instead of three), in `_gemm_layout`.
    The modules' own weights become views of it: the model's forward gives the same results and the weights
    are held once."""
    import torch

    weight = _gemm_layout(torch.cat([m.weight for m in linears]))
    bias = torch.cat([m.bias for m in linears]).detach()
    at = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[at : at + rows], requires_grad=False)
        m.bias = torch.nn.Parameter(bias[at : at + rows], requires_grad=False)
        at += rows
    return _Linear(weight, bias)


def bfloat16_supported() -> bool:
    """Whether oneDNN can run bfloat16 products on this CPU at all (natively or emulated)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def bfloat16_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX tiles or AVX-512 BF16) and oneDNN can use
    it: elsewhere bfloat16 products are emulated, slower than float32."""
    import torch

    try:
        hardware = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    except (AttributeError, RuntimeError):  # a torch without these probes
        return False
    return bool(hardware) and bfloat16_supported()


def _packed(linear: _Linear) -> _Linear:
    """`linear` with its weight also in bfloat16, reordered once into oneDNN's blocked layout (reordering it at
    every call costs as much as the product); the float32 weight stays for the model's own forward."""
    import torch

    weight = linear.weight.detach().to(torch.bfloat16).contiguous()
    return _Linear(linear.weight, linear.bias, torch.ops.mkldnn._reorder_linear_weight(weight, None))


class BertEncoder:
    """`encoder(input_ids, token_type_ids, attention_mask)` → last hidden state (batch, tokens, hidden)."""

    def __init__(self, model, *, bfloat16: bool = False):
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.hidden = int(config.hidden_size)
        self.eps = float(config.layer_norm_eps)
        self.embeddings = model.embeddings
        layers = []
        for layer in model.encoder.layer:
            own = layer.attention.self
            layers.append(
                _Layer(
                    _relaid(own.query, own.key, own.value),
                    _relaid(layer.attention.output.dense),
                    layer.attention.output.LayerNorm,
                    _relaid(layer.intermediate.dense),
                    _relaid(layer.output.dense),
                    layer.output.LayerNorm,
                )
            )
        if bfloat16:
            layers = [
                _Layer(
                    _packed(layer.qkv),
                    _packed(layer.attn_out),
                    layer.attn_norm,
                    _packed(layer.intermediate),
                    _packed(layer.out),
                    layer.out_norm,
                )
                for layer in layers
            ]
        self.layers = layers
        self.precision = "bfloat16" if bfloat16 else "float32"

    @classmethod
    def of(cls, model, *, bfloat16: bool = False) -> BertEncoder | None:
        """The fast path for `model`, or None when it is not a plain BERT encoder this module reproduces."""
        config = model.config
        plain = (
            getattr(config, "model_type", None) == "bert"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and getattr(config, "hidden_act", None) == "gelu"
            and not getattr(config, "is_decoder", False)
            and not getattr(config, "add_cross_attention", False)
            and not getattr(config, "chunk_size_feed_forward", 0)
            and hasattr(model, "embeddings")
            and hasattr(model, "encoder")
            and config.hidden_size % config.num_attention_heads == 0
        )
        return cls(model, bfloat16=bfloat16) if plain else None

    def __call__(self, input_ids, token_type_ids, attention_mask):
        import torch
        from torch.nn import functional as F

        batch, tokens = input_ids.shape
        heads, hidden, eps = self.heads, self.hidden, self.eps
        emb = self.embeddings
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (
            F.embedding(input_ids, emb.word_embeddings.weight)
            + F.embedding(token_type_ids, emb.token_type_embeddings.weight)
            + emb.position_embeddings.weight[:tokens]
        )
        x = F.layer_norm(x, (hidden,), emb.LayerNorm.weight, emb.LayerNorm.bias, eps)
        mask = None  # no padding in the batch: no mask, as transformers does for SDPA
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min

        if self.precision == "bfloat16":
            return self._bfloat16_layers(x, mask, batch, tokens)

        def add_norm(y, residual, proj, norm):
            """BERT's "add & norm": the projection of `y`, plus the residual, layer-normed."""
            return F.layer_norm(
                F.linear(y, proj.weight, proj.bias) + residual, (hidden,), norm.weight, norm.bias, eps
            )

        for layer in self.layers:
            qkv = F.linear(x, layer.qkv.weight, layer.qkv.bias)
            qkv = qkv.view(batch, tokens, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
            context = context.transpose(1, 2).reshape(batch, tokens, hidden)
            x = add_norm(context, x, layer.attn_out, layer.attn_norm)
            inner = F.gelu(F.linear(x, layer.intermediate.weight, layer.intermediate.bias))
            x = add_norm(inner, x, layer.out, layer.out_norm)
        return x

    def _bfloat16_layers(self, x, mask, batch: int, tokens: int):
        """The layers with bfloat16 products (float32 sums; GELU applied to the sums, then rounded), everything
        else in float32. The products run on the batch's rows flattened and padded to `row_bucket(rows)`:
        oneDNN builds a kernel for each row count it meets (about 5 ms a pass the first time), and a running
        worker meets thousands (a batch's size times its longest text); buckets keep them to a few dozen, at
        most an eighth more rows computed. Rows never mix in a product, so the padding changes nothing else."""
        import torch
        from torch.nn import functional as F

        heads, hidden, eps = self.heads, self.hidden, self.eps
        product = torch.ops.mkldnn._linear_pointwise
        rows = batch * tokens
        padded_rows = row_bucket(rows)

        def padded(y):
            """`y` (batch, tokens, width) as (padded_rows, width) bfloat16, the extra rows zero."""
            out = y.new_empty((padded_rows, y.shape[-1]), dtype=torch.bfloat16)
            out[:rows].copy_(y.reshape(rows, -1))
            out[rows:].zero_()
            return out

        def unpadded(y):
            """The real rows of a product, widened to float32, as (batch, tokens, width)."""
            return y[:rows].to(torch.float32).view(batch, tokens, -1)

        def add_norm(y, residual, proj, norm):
            """BERT's "add & norm", `y` already padded bfloat16 rows."""
            projected = unpadded(product(y, proj.packed, proj.bias, "none", [], ""))
            return F.layer_norm(projected + residual, (hidden,), norm.weight, norm.bias, eps)

        for layer in self.layers:
            qkv = unpadded(product(padded(x), layer.qkv.packed, layer.qkv.bias, "none", [], ""))
            qkv = qkv.view(batch, tokens, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
            context = context.transpose(1, 2).reshape(batch, tokens, hidden)
            x = add_norm(padded(context), x, layer.attn_out, layer.attn_norm)
            inner = product(padded(x), layer.intermediate.packed, layer.intermediate.bias, "gelu", [], "none")
            x = add_norm(inner, x, layer.out, layer.out_norm)
        return x


def row_bucket(rows: int) -> int:
    """`rows` rounded up to 16, or to a number with at most four significant bits (k × 2^e, 8 ≤ k < 16): eight
    buckets per doubling, each at most an eighth above the rows it holds."""
    if rows <= 16:
        return 16
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step
