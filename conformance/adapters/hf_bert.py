"""Hugging Face's BERT-family ``relative_key`` attention (transformers 4.x), as one whole ``BertSelfAttention``.

``BertSelfAttention(config)`` with ``position_embedding_type="relative_key"``
adds ``q_i . E[i - j + P - 1]`` to ``q_i . k_j`` before the ``1/sqrt(d)``
scale, ``E = distance_embedding.weight`` (2P - 1, d), P =
``max_position_embeddings``. That is Shaw's key term (REL-1, SCALE-3 with
the relative term scaled) with ``k = P - 1``, no value term and one table for
every head: ``rel_k = E[::-1]`` (the spec's distance is key minus query,
POS-2). BERT does not clip: a distance beyond P - 1 is an ``IndexError``, so
a case runs when its distances stay within ``k`` (then ``Shaw(k)`` never
clips either). The same code is in 26 models of transformers 4.x (RoBERTa,
ELECTRA, ...); transformers 5 removed it (PR #41170), so this adapter is
certified in an environment of its own, the ``hf4`` extra.

The layer is built in float32 from a ``BertConfig`` (random weights), cast
with ``.to(dtype)``, loaded with wq/wk/wv (the query, key, value linears);
the adapter appends ``wo``, ``bo`` as a linear ``out_proj``
(``BertSelfOutput`` adds a residual and a LayerNorm, which are not
attention). The mask goes in as BERT
makes it: an additive ``finfo(dtype).min`` where a key is masked
(``get_extended_attention_mask``), plus the bias input. Cross-attention
feeds one tensor to the key and value linears; the harness's separate key
and value arrays reach them through forward pre-hooks (each linear its own
input), in every call.

Axis legend (AXES-1): B, H, Lq, Lk, D, d; P max_position_embeddings.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import _glue, _hf_layers, _torch
from .base import Capabilities
from .hf_bias_layers import _LayerAdapter

HF4_INSTALL = 'pip install -e ".[torch,conformance,hf4]" (transformers 4.57.6)'
#: BERT's linears, and the output projection the adapter appends as ``out_proj`` (BertSelfOutput is not attention)
BERT_PROJECTIONS = (("query", "wq", "bq"), ("key", "wk", "bk"), ("value", "wv", "bv"), ("out_proj", "wo", "bo"))


class HFBertRelativeKeyAdapter(_LayerAdapter):
    name = "hf-bert-relative-key"
    description = "transformers 4.x BertSelfAttention(position_embedding_type='relative_key'), weights loaded"
    projections = BERT_PROJECTIONS
    table = "distance_embedding.weight"
    table_param = "rel_k"
    cross_attention = True  # encoder_hidden_states carries the keys (and, by the hooks, the values)
    embedding_type = "relative_key"

    def unavailable(self):
        missing = _torch.torch_available()
        if missing:
            return missing
        try:
            import transformers
            from transformers.models.bert.modeling_bert import BertSelfAttention
        except ImportError as e:
            return f"transformers is not installed ({e}); in an environment of its own: {HF4_INSTALL}"
        import inspect

        if "position_embedding_type" not in inspect.signature(BertSelfAttention.__init__).parameters:
            return (
                f"transformers {transformers.__version__} has no relative_key attention (removed in 5.0, "
                f"https://github.com/huggingface/transformers/pull/41170); in an environment of its own: {HF4_INSTALL}"
            )
        return None

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"shaw", "cross-attention", "mask", "bias"}),
            notes={
                "shaw-values": "relative_key has no value term",
                "per-head-tables": "relative_key has one table for every head",
                "unscaled-relative": "BERT scales q.k and the relative term together",
                "custom-scale": "BertSelfAttention divides by sqrt(attention_head_size)",
                "no-projection-bias": "BERT's query, key and value linears have biases",
                "positions": "BertSelfAttention places queries and keys at arange(L)",
                "causal": "BertSelfAttention takes causality through its additive mask only",
                "huang": "not Huang's scheme",
            },
            requires=frozenset({"shaw"}),
        )

    def unsupported_case(self, case):
        shaw = _glue.scheme(case.spec, "shaw")
        if shaw is None:
            return None
        longest = max(case.dims.Lq, case.dims.Lk) - 1
        if longest > shaw.max_distance:
            return (
                f"BERT does not clip distances (IndexError beyond max_position_embeddings - 1): the case's reach "
                f"{longest} beyond k = {shaw.max_distance}"
            )
        return None

    def classes(self) -> tuple:
        """(config class, layer class, extra config fields) of the model."""
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertSelfAttention

        return BertConfig, BertSelfAttention, {}

    def build(self, spec, dtype, device):
        import torch

        config_class, layer_class, extra = self.classes()
        config = config_class(
            hidden_size=spec.num_heads * spec.head_dim,
            num_attention_heads=spec.num_heads,
            max_position_embeddings=_glue.scheme(spec, "shaw").max_distance + 1,
            position_embedding_type=self.embedding_type,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
            **extra,
        )
        m = layer_class(config, layer_idx=0)
        m.out_proj = torch.nn.Linear(spec.num_heads * spec.head_dim, spec.model_dim)  # OUT-1: wo, bo
        return m.to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def to_table(self, rel_k):  # E[m] is distance i - j = m - (P - 1): the spec's rows reversed
        return np.asarray(rel_k)[::-1]

    def from_table(self, table):
        return np.asarray(table)[::-1]

    def call(self, spec, m, t, inputs, *, training):

        x = t["query"]
        mask = _hf_layers.additive_mask(spec, inputs, t, t.get("key", x).shape[1])
        cross = t.get("key") if self.cross_attention else None  # the k, v linears read their own inputs (hooks)
        context, weights = m(x, attention_mask=mask, encoder_hidden_states=cross, output_attentions=True)
        return m.out_proj(context), weights


class _KeyQuery:
    """``relative_key_query``: ``relative_key`` plus the key-side term ``k_j . E[i - j + P - 1]`` from the same
    table (SHAW-6, ``key_side="shared"``); whether it is scaled (SHAW-7) is the model's ``key_side_scaled``."""

    embedding_type = "relative_key_query"
    key_side_scaled = True

    def capabilities(self):
        caps = super().capabilities()
        return replace(caps, features=caps.features | {"shaw-key-side"}, requires=caps.requires | {"shaw-key-side"})

    def unsupported_case(self, case):
        shaw = _glue.scheme(case.spec, "shaw")
        if shaw is not None and shaw.key_side != "shared":
            return f"{self.embedding_type} reads its one distance table for the query and the key (key_side='shared')"
        if shaw is not None and shaw.key_side_scaled != self.key_side_scaled:
            return f"{self.embedding_type} {'scales' if self.key_side_scaled else 'does not scale'} its key-side term"
        return super().unsupported_case(case)


class HFBertRelativeKeyQueryAdapter(_KeyQuery, HFBertRelativeKeyAdapter):
    """BERT's ``relative_key_query``: the three terms summed before the ``1/sqrt(d)`` scale,
    ``Shaw(P - 1, values=False, key_side="shared")`` (the key-side term scaled, SHAW-7)."""

    name = "hf-bert-relative-key-query"
    description = "transformers 4.x BertSelfAttention(position_embedding_type='relative_key_query'), weights loaded"


class HFEsmRelativeKeyAdapter(HFBertRelativeKeyAdapter):
    """ESM's ``EsmSelfAttention(relative_key)``: BERT's term, with the query scaled by ``d ** -0.5`` before both
    products (so the relative term is scaled too, SCALE-3) and a float32 softmax; self-attention only (its key
    and value heads are viewed with the query's length)."""

    name = "hf-esm-relative-key"
    cross_attention = False  # its cross-attention swaps in encoder_attention_mask; self-attention here
    description = "transformers 4.x EsmSelfAttention(position_embedding_type='relative_key'), weights loaded"

    def unavailable(self):
        reason = super().unavailable()
        if reason:
            return reason
        import inspect

        from transformers.models.esm.modeling_esm import EsmSelfAttention

        if "position_embedding_type" not in inspect.signature(EsmSelfAttention.__init__).parameters:
            return f"this transformers has no ESM relative_key attention; in an environment of its own: {HF4_INSTALL}"
        return None

    def capabilities(self):
        caps = super().capabilities()
        notes = {**caps.notes, "cross-attention": "EsmSelfAttention views k and v with the query's length"}
        return Capabilities(
            devices=caps.devices, features=caps.features - {"cross-attention"}, notes=notes, requires=caps.requires
        )

    def classes(self):
        from transformers import EsmConfig
        from transformers.models.esm.modeling_esm import EsmSelfAttention

        return EsmConfig, EsmSelfAttention, {"vocab_size": 33}


class HFEsmRelativeKeyQueryAdapter(_KeyQuery, HFEsmRelativeKeyAdapter):
    """ESM's ``relative_key_query``: its query is scaled before all three products, so the key-side term is
    the one term left unscaled: ``Shaw(P - 1, values=False, key_side="shared", key_side_scaled=False)`` (SHAW-7)."""

    name = "hf-esm-relative-key-query"
    description = "transformers 4.x EsmSelfAttention(position_embedding_type='relative_key_query'), weights loaded"
    key_side_scaled = False


class HFAlbertRelativeKeyAdapter(HFBertRelativeKeyAdapter):
    """ALBERT's ``AlbertAttention(relative_key)``: BERT's term with the same reversed table, added *after* the
    ``1/sqrt(d)`` scale (SCALE-3 with ``scale_relative=False``); self-attention only. Its ``dense`` linear is the
    output projection (``wo``, ``bo``); the layer then adds the residual and a LayerNorm, which are not attention,
    so the adapter takes ``dense``'s output through a forward hook."""

    name = "hf-albert-relative-key"
    description = "transformers 4.x AlbertAttention(position_embedding_type='relative_key'), weights loaded"
    projections = (("query", "wq", "bq"), ("key", "wk", "bk"), ("value", "wv", "bv"), ("dense", "wo", "bo"))
    cross_attention = False

    def capabilities(self):
        caps = super().capabilities()
        notes = {k: v for k, v in caps.notes.items() if k != "unscaled-relative"}
        notes["cross-attention"] = "AlbertAttention is self-attention only"
        return replace(
            caps,
            features=caps.features - {"cross-attention"} | {"unscaled-relative"},
            notes=notes,
            requires=caps.requires | {"unscaled-relative"},
        )

    def classes(self):
        from transformers import AlbertConfig
        from transformers.models.albert.modeling_albert import AlbertAttention

        return AlbertConfig, AlbertAttention, {}

    def build(self, spec, dtype, device):
        config_class, layer_class, extra = self.classes()
        config = config_class(
            hidden_size=spec.model_dim,
            embedding_size=spec.model_dim,
            num_attention_heads=spec.num_heads,
            intermediate_size=4 * spec.model_dim,
            max_position_embeddings=_glue.scheme(spec, "shaw").max_distance + 1,
            position_embedding_type=self.embedding_type,
            attention_probs_dropout_prob=0.0,
            hidden_dropout_prob=0.0,
            **extra,
        )
        return layer_class(config).to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def call(self, spec, m, t, inputs, *, training):
        x = t["query"]
        mask = _hf_layers.additive_mask(spec, inputs, t, x.shape[1])
        seen = []
        hook = m.dense.register_forward_hook(lambda mod, args, out: seen.append(out))
        try:  # the dense output, before the residual and the LayerNorm (OUT-1)
            _, weights = m(x, attention_mask=mask, output_attentions=True)
        finally:
            hook.remove()
        return seen[0], weights


class HFAlbertRelativeKeyQueryAdapter(_KeyQuery, HFAlbertRelativeKeyAdapter):
    """ALBERT's ``relative_key_query``: both relative terms from the one table, added after the scale:
    ``Shaw(P - 1, values=False, key_side="shared")`` with ``scale_relative=False`` (SHAW-6, SHAW-7: the key-side
    term's factor is ``s_rel = 1`` too)."""

    name = "hf-albert-relative-key-query"
    description = "transformers 4.x AlbertAttention(position_embedding_type='relative_key_query'), weights loaded"
