"""Hugging Face 5.x attention layers with learned relative distances: Wav2Vec2-BERT and DeBERTa-v2.

Each is one whole layer built from its config with random weights (nothing
is downloaded), in float32, cast with ``.to(dtype)``, loaded with the
canonical parameters (``_hf_layers``), eager attention; the masks go in as
the models make them (``finfo(dtype).min`` where a key is masked, MASK-1).

- ``hf-wav2vec2-bert-relative-key``: ``Wav2Vec2BertSelfAttention`` with
  ``position_embeddings_type="relative_key"`` adds ``s * q_i .
  E[clip(j - i, -left, right) + left]`` (the distance is key minus query,
  POS-2), ``E = distance_embedding.weight`` of ``left + right + 1`` rows.
  With ``left = right = k`` that is ``Shaw(k, values=False)`` with
  ``rel_k = E`` as it is (SHAW-1..3, the relative term scaled, SCALE-3).
  Its default window ``[-64, 8]`` is ``Shaw(64)`` whose rows past distance 8
  repeat the row of 8 (``asymmetric_table``): an asymmetric clip is a
  symmetric one with replicated edge rows.
- ``hf-deberta-v2-attention``: ``DisentangledSelfAttention`` with
  ``pos_att_type=["c2p", "p2c"]`` and ``max_relative_positions = span``
  computes ``(q_i . k_j + q_i . Pk[m] + k_j . Pq[m]) / sqrt(3 d)`` with
  ``m = clip(i - j + span, 0, 2 span - 1)`` and per-head tables ``Pk``,
  ``Pq`` (the rows of ``rel_embeddings`` through ``pos_key_proj`` and
  ``pos_query_proj``). The key-minus-query distance of row ``m`` is
  ``span - m``: rows ``-(span - 1) .. span``, one more on the positive side
  than on the negative. With ``span = k + 1`` that is ``Shaw(k, values=False,
  per_head=True, key_side="own")`` at ``scale = 1/sqrt(3 d)`` (SHAW-6,
  SHAW-7: content-to-position is the key term, position-to-content the
  key-side term with its own table ``rel_q``), its tables ``rel_k[h]`` and
  ``rel_q[h]`` reversed with the edge row for distance ``k`` written twice
  (``deberta_table``). The adapter hands the layer one-hot relative
  embeddings and writes the tables into the two position projections'
  weights, so ``Pk``, ``Pq`` are the tables themselves and their gradients
  come back through those weights.

Axis legend (AXES-1): B, H, Lq, Lk, D, d; k Shaw's max_distance, R = 2k + 1 table rows.
"""

from __future__ import annotations

import numpy as np

from . import _glue, _hf_layers, _torch
from .base import Capabilities
from .hf_bias_layers import _LayerAdapter

W2V_PROJECTIONS = (
    ("linear_q", "wq", "bq"),
    ("linear_k", "wk", "bk"),
    ("linear_v", "wv", "bv"),
    ("linear_out", "wo", "bo"),
)
DEBERTA_PROJECTIONS = (("query_proj", "wq", "bq"), ("key_proj", "wk", "bk"), ("value_proj", "wv", "bv"))
#: What neither layer takes: each is a self-attention encoder layer at default positions.
ENCODER_NOTES = {
    "cross-attention": "the layer is self-attention only",
    "positions": "the layer places queries and keys at arange(L)",
    "causal": "the layer is an encoder (no causal rule)",
    "mask-fill": "the layer fills masked logits with finfo(dtype).min",
    "dropout-keep": "the layer's dropout draws from torch's RNG",
    "dropout-spec": "the layer's dropout draws from torch's RNG",
    "shaw-values": "the layer has no value term",
    "huang": "not Huang's scheme",
}


def asymmetric_table(table: np.ndarray, left: int, right: int) -> np.ndarray:
    """The ``Shaw(max(left, right))`` table (R, d) of a ``[-left, right]`` window's ``(left + right + 1, d)``
    table: the short side's edge row repeated out to the long side's reach (SHAW-2)."""
    k = max(left, right)
    return np.concatenate([np.repeat(table[:1], k - left, 0), table, np.repeat(table[-1:], k - right, 0)])


def deberta_table(rel: np.ndarray) -> np.ndarray:
    """DeBERTa's ``(..., 2 span, d)`` rows of a ``Shaw(k)`` table (..., R, d), ``span = k + 1``: row m is
    distance ``span - m`` (key minus query), clipped to ``[-k, k]``: ``[rel[2k], rel[2k], rel[2k - 1], ...,
    rel[0]]``."""
    return np.concatenate([rel[..., -1:, :], rel[..., ::-1, :]], axis=-2)


def shaw_table(rows: np.ndarray, *, grad: bool) -> np.ndarray:
    """The inverse of ``deberta_table``: the ``Shaw(k)`` table of DeBERTa's rows, or with ``grad`` the table's
    gradient (the two rows of distance k both read ``rel[2k]``: their gradients add)."""
    rel = rows[..., :0:-1, :].copy()
    if grad:
        rel[..., -1, :] += rows[..., 0, :]
    return rel


class HFWav2Vec2BertRelativeKeyAdapter(_LayerAdapter):
    name = "hf-wav2vec2-bert-relative-key"
    description = "transformers Wav2Vec2BertSelfAttention(position_embeddings_type='relative_key'), weights loaded"
    projections = W2V_PROJECTIONS
    table = "distance_embedding.weight"
    table_param = "rel_k"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"shaw", "mask", "bias"}),
            notes={
                **ENCODER_NOTES,
                "per-head-tables": "relative_key has one table for every head",
                "unscaled-relative": "the relative term is scaled with the content",
                "custom-scale": "the layer scales by head_size ** -0.5",
                "no-projection-bias": "the layer's linears have biases",
            },
            requires=frozenset({"shaw"}),
        )

    def build(self, spec, dtype, device):
        from transformers import Wav2Vec2BertConfig
        from transformers.models.wav2vec2_bert.modeling_wav2vec2_bert import Wav2Vec2BertSelfAttention

        k = _glue.scheme(spec, "shaw").max_distance
        config = Wav2Vec2BertConfig(
            hidden_size=spec.model_dim,
            num_attention_heads=spec.num_heads,
            position_embeddings_type="relative_key",
            left_max_position_embeddings=k,
            right_max_position_embeddings=k,
            attention_dropout=0.0,
        )
        config._attn_implementation = "eager"
        return Wav2Vec2BertSelfAttention(config).to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def to_table(self, rel_k):  # E[m] is distance m - k (key minus query): the spec's rows as they are
        return np.asarray(rel_k)

    def from_table(self, table):
        return np.asarray(table)

    def call(self, spec, m, t, inputs, *, training):
        return m(t["query"], attention_mask=_hf_layers.additive_mask(spec, inputs, t, t["query"].shape[1]))


class HFDebertaV2AttentionAdapter(_LayerAdapter):
    name = "hf-deberta-v2-attention"
    description = "transformers DebertaV2 DisentangledSelfAttention(pos_att_type=['c2p', 'p2c']), weights loaded"
    projections = (*DEBERTA_PROJECTIONS, ("out_proj", "wo", "bo"))
    #: canonical table -> the position projection that carries it (c2p reads Pk, p2c reads Pq)
    position_projections = {"rel_k": "pos_key_proj", "rel_q": "pos_query_proj"}

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"shaw", "shaw-key-side", "per-head-tables", "custom-scale", "mask"}),
            notes={
                **ENCODER_NOTES,
                "bias": "DisentangledSelfAttention takes a boolean mask only",
                "unscaled-relative": "the three logits share one scale",
                "no-projection-bias": "the layer's linears have biases",
            },
            requires=frozenset({"shaw-key-side"}),
        )

    def unsupported_case(self, case):
        shaw = _glue.scheme(case.spec, "shaw")
        if shaw is None:
            return None
        want = 1 / np.sqrt(3 * case.spec.head_dim)
        if not (shaw.keys and shaw.key_side == "own" and shaw.per_head and shaw.key_side_scaled):
            return "DeBERTa's c2p and p2c are Shaw keys and an own-table key side, per head, scaled (SHAW-6, SHAW-7)"
        if case.spec.scale is None or not np.isclose(case.spec.scale, want, rtol=1e-12):
            return f"DeBERTa scales its three logits by 1/sqrt(3 d) = {want:.6g} (c2p and p2c), got {case.spec.scale}"
        if 2 * (shaw.max_distance + 1) > case.spec.model_dim:
            return f"the adapter's one-hot relative embeddings need 2 (k + 1) <= D, got k = {shaw.max_distance}"
        return None

    def build(self, spec, dtype, device):
        import torch
        from transformers import DebertaV2Config
        from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

        config = DebertaV2Config(
            hidden_size=spec.model_dim,
            num_attention_heads=spec.num_heads,
            relative_attention=True,
            pos_att_type=["c2p", "p2c"],
            position_buckets=-1,
            max_relative_positions=_glue.scheme(spec, "shaw").max_distance + 1,
            share_att_key=False,
            attention_probs_dropout_prob=0.0,
            hidden_dropout_prob=0.0,
        )
        m = DisentangledSelfAttention(config)
        m.out_proj = torch.nn.Linear(spec.model_dim, spec.model_dim)  # OUT-1: wo, bo (DebertaV2SelfOutput is not)
        return m.to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def load_tables(self, m, params, device):
        """Pk and Pq are ``pos_*_proj(rel_embeddings)``: with one-hot embeddings (``call``) row m is the weight's
        column m, so the columns 0 .. 2 span - 1 hold DeBERTa's rows of each head's table, the rest and the
        biases 0."""
        for name, proj in self.position_projections.items():
            rows = deberta_table(np.asarray(params[name]))  # (H, 2 span, d)
            H, S, d = rows.shape
            linear = getattr(m, proj)
            linear.weight.zero_()
            linear.bias.zero_()
            linear.weight[:, :S].copy_(
                _torch.to_torch(np.ascontiguousarray(rows.transpose(0, 2, 1).reshape(H * d, S)), device)
            )

    def tables(self, m, *, grad):
        out = {}
        for name, proj in self.position_projections.items():
            weight = getattr(m, proj).weight
            H, d = m.num_attention_heads, m.attention_head_size
            S = 2 * m.pos_ebd_size
            cols = _torch.to_numpy(weight.grad if grad else weight)[:, :S]  # (H * d, 2 span)
            out[name] = np.ascontiguousarray(shaw_table(cols.reshape(H, d, S).transpose(0, 2, 1), grad=grad))
        return out

    def call(self, spec, m, t, inputs, *, training):
        import torch

        x = t["query"]
        B, L = x.shape[:2]
        allowed = _torch.allowed_mask(spec, inputs, B, spec.num_heads, L, L, str(x.device))
        one_hot = torch.eye(2 * m.pos_ebd_size, spec.model_dim, dtype=x.dtype, device=x.device)
        context, weights = m(x, allowed, output_attentions=True, rel_embeddings=one_hot)
        return m.out_proj(context), weights
