"""Whole Hugging Face attention layers with a position bias: ``SwinAttention`` and ``T5Attention``.

Each is built from its config with random weights (nothing is downloaded),
in float32, cast with ``.to(dtype)``, and loaded with the canonical
parameters (``_hf_layers``); the table ``rel_b`` (H, R) goes into the
layer's own table parameter in the layer's layout, and its gradient comes
back the same way.

- ``hf-swin-attention``: ``SwinAttention(config, D, H, window_size)`` (eager
  attention) on one window of ``Wh * Ww`` tokens in row-major order (the
  spec's default positions, POS-5). ``SwinAttention`` takes one square size;
  for a ``(Wh, Ww)`` window its ``relative_position_bias`` is the library's
  own ``SwinRelativePositionBias(H, (Wh, Ww))``. Its table is
  ``((2Wh-1)(2Ww-1), H)``, indexed by query minus key coordinates: it holds
  ``rel_b`` reversed along R and transposed (SWIN-3). The ``bias`` input of
  one shared (Lq, Lk) matrix is the layer's ``attention_mask`` of one window,
  as Swin passes its shifted-window -100 mask (SWIN-5).
- ``hf-t5-attention``: ``T5Attention(config, has_relative_attention_bias=True)``
  (no projection biases, no logit scale), ``is_decoder = not bidirectional``.
  An encoder call passes the padding mask as T5 does, an additive (B, 1, 1,
  Lk) ``finfo(dtype).min`` where a key is masked. A decoder (causal) call is
  made the way T5 generates: every query but the last in one call that fills
  an ``EncoderDecoderCache``, then one cached decode step for the last query
  (``past_seen_tokens`` places its bucket row), with T5's additive causal
  mask; the gradients come from one uncached call with that mask, as in
  training.

Axis legend (AXES-1): B, H, Lq, Lk, D, d; R table rows; N = Wh * Ww tokens.
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import _glue, _hf_layers, _torch
from .base import Capabilities
from .hf_rope import transformers_unavailable

SWIN_PROJECTIONS = _hf_layers.LLAMA_PROJECTIONS
T5_PROJECTIONS = (("q", "wq", "bq"), ("k", "wk", "bk"), ("v", "wv", "bv"), ("o", "wo", "bo"))


class _LayerAdapter(_torch.TorchAdapter):
    """One whole HF layer: subclasses build, call and map its table."""

    projections: tuple = ()
    table: str = ""  # the attribute path of the layer's table parameter
    table_param: str = "rel_b"  # the canonical parameter it holds (PARAM-1)
    transformers_major = None  # the one major release of transformers the layer is certified against, if one

    def unavailable(self):
        return transformers_unavailable(self.transformers_major)

    def environment(self):
        import transformers

        return {**_torch.pin_numerics(), "transformers": transformers.__version__}

    def build(self, spec, dtype: str, device: str):
        """The layer in float32, cast to ``dtype``, eval mode."""
        raise NotImplementedError

    def to_table(self, rel_b: np.ndarray) -> np.ndarray:
        """The layer's table of the canonical (H, R) ``rel_b``."""
        raise NotImplementedError

    def from_table(self, table: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def call(self, spec, m, t: dict, inputs: dict, *, training: bool):
        """out (B, Lq, D) and the weights (B, H, Lq, Lk) or None."""
        raise NotImplementedError

    def load_weights(self, m, params: dict, device: str):
        return _hf_layers.load(m, params, device, self.projections)

    def canonical_weights(self, m) -> dict:
        return _hf_layers.canonical(m, self.projections)

    def weight_gradients(self, m) -> dict:
        return _hf_layers.gradients(m, self.projections)

    def own_inputs(self, m, t: dict):
        """A context in which the key and value projections read t["key"] and t["value"] (the partials; the
        query where a self-attention call has none)."""
        key = t.get("key", t["query"])
        return _hf_layers.own_inputs(m, {self.projections[1][0]: key, self.projections[2][0]: t.get("value", key)})

    def layer(self, spec, params: dict, device: str):
        import torch

        m = self.load_weights(self.build(spec, params["wq"].dtype.name, device), params, device)
        with torch.no_grad():
            self.load_tables(m, params, device)
        return m

    def load_tables(self, m, params: dict, device: str) -> None:
        """Write the canonical table(s) into the layer's parameters (under no_grad)."""
        table = _torch.to_torch(np.ascontiguousarray(self.to_table(params[self.table_param])), device)
        self._table(m).copy_(table)

    def tables(self, m, *, grad: bool) -> dict:
        """The canonical table(s) read back from the layer (PARAM-3), or their gradients after a backward pass."""
        table = self._table(m).grad if grad else self._table(m)
        return {self.table_param: np.ascontiguousarray(self.from_table(_torch.to_numpy(table)))}

    def _table(self, m):
        obj = m
        for part in self.table.split("."):
            obj = getattr(obj, part)
        return obj

    def roundtrip_params(self, spec, params):
        m = self.layer(spec, params, "cpu")
        return {**self.canonical_weights(m), **self.tables(m, grad=False)}

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        m = self.layer(spec, params, device)
        names = ("query", "key", "value", "bias")
        t = {n: _torch.to_torch(inputs[n], device) for n in names if inputs.get(n) is not None}
        split = self.own_inputs(m, t) if "key" in t else contextlib.nullcontext()  # cross-attention: k, v apart
        with torch.no_grad(), split:
            out, weights = self.call(spec, m, t, inputs, training=False)
        res = {"out": _torch.to_numpy(out)}
        if need_weights:
            res["weights"] = _torch.to_numpy(weights)
        return res

    def vjp(self, spec, params, inputs, grad_out, *, device):
        import torch

        m = self.layer(spec, params, device)
        for p in m.parameters():
            p.requires_grad_(True)
        names = [n for n in ("query", "key", "value", "bias") if inputs.get(n) is not None]
        t = {n: _torch.to_torch(inputs[n], device, requires_grad=True) for n in names}
        with self.own_inputs(m, t):  # the partials for key and value
            out, _ = self.call(spec, m, t, inputs, training=True)
        out.backward(_torch.to_torch(grad_out, device))
        grads = {n: _torch.to_numpy(t[n].grad if t[n].grad is not None else torch.zeros_like(t[n])) for n in names}
        return {**grads, **self.tables(m, grad=True), **self.weight_gradients(m)}


# ---------------------------------------------------------------------------- Swin
class SwinWindowLayer(_LayerAdapter):
    """What a Swin window-attention layer (HF's, timm's) can run: one window, its table reversed (SWIN-3)."""

    layer_name = "SwinAttention"
    returns_weights = True

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"swin", "bias"}),
            notes={
                "cross-attention": f"{self.layer_name} is self-attention within one window",
                "positions": f"{self.layer_name}'s tokens are the window's in row-major order (POS-5): no positions",
                "swin-prefix": "Swin has no class token (BEiT's relative position bias has one)",
                "no-projection-bias": f"{self.layer_name}'s output projection always has a bias",
                "custom-scale": f"{self.layer_name}'s scaling is head_dim ** -0.5",
                "mask": f"{self.layer_name} takes an additive mask only (the bias input)",
                "causal": f"{self.layer_name} is not causal",
                "shaw": "no Shaw tables",
                "huang": "no Huang tables",
            },
            requires=frozenset({"swin"}),
            weights=self.returns_weights,
        )

    def unsupported_case(self, case):
        swin = _glue.scheme(case.spec, "swin")
        if swin is None:
            return None
        Wh, Ww = swin.window
        if case.dims.Lq != Wh * Ww:
            return f"{self.layer_name} attends within one window: L = Wh * Ww = {Wh * Ww} tokens, not {case.dims.Lq}"
        shared = all(getattr(r, "pattern", "11").startswith("11") for r in case.recipes if type(r).__name__ == "Bias")
        return None if shared else f"{self.layer_name}'s mask is one (N, N) matrix per window, for every head"

    def to_table(self, rel_b):  # SWIN-3: query minus key coordinates index the rows in reverse
        return np.asarray(rel_b)[:, ::-1].T

    def from_table(self, table):
        return np.asarray(table).T[:, ::-1]

    def window_mask(self, t):
        """SWIN-5: the bias input as the layer's mask of one window, (1, N, N), or None."""
        bias = t.get("bias")
        if bias is None:
            return None
        if bias.shape[0] != 1 or bias.shape[1] != 1:
            raise ValueError(f"bias: {self.name} takes one (1, 1, N, N) matrix, got shape {tuple(bias.shape)}")
        return bias[0]


class HFSwinAttentionAdapter(SwinWindowLayer):
    name = "hf-swin-attention"
    description = "transformers SwinAttention (eager) on one window, canonical weights and table loaded"
    projections = SWIN_PROJECTIONS
    transformers_major = 5
    table = "relative_position_bias.relative_position_bias_table"

    def build(self, spec, dtype, device):
        from transformers import SwinConfig
        from transformers.models.swin.modeling_swin import SwinAttention, SwinRelativePositionBias

        Wh, Ww = _glue.scheme(spec, "swin").window
        config = SwinConfig(
            embed_dim=spec.model_dim,
            depths=[1],
            num_heads=[spec.num_heads],
            window_size=Wh,
            qkv_bias=spec.bias,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        m = SwinAttention(config, spec.model_dim, spec.num_heads, Wh)
        if Ww != Wh:  # the layer's own bias module, for the window it cannot be given as one size
            m.relative_position_bias = SwinRelativePositionBias(spec.num_heads, (Wh, Ww))
        return m.to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def call(self, spec, m, t, inputs, *, training):
        return m(t["query"], attention_mask=self.window_mask(t))


# ------------------------------------------------------------------------------ T5
class HFT5AttentionAdapter(_LayerAdapter):
    name = "hf-t5-attention"
    description = "transformers T5Attention (eager; a decoder decodes its last query from the cache), weights loaded"
    projections = T5_PROJECTIONS
    transformers_major = 5
    table = "relative_attention_bias.weight"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"t5", "t5-causal", "causal", "mask", "no-projection-bias", "custom-scale"}),
            notes={
                "cross-attention": "T5's cross-attention layers have no relative bias, and k and v come from one "
                "key_value_states",
                "positions": "T5Attention places the queries at arange(Lq) + past_seen_tokens and the keys at "
                "arange(Lk)",
                "bias": "T5Attention's additive mask is its own: the bias input is not expressible beside it",
                "grouped-kv-heads": "T5Attention has one key/value head per head",
                "value-head-dim": "T5Attention's values have d_kv channels per head",
                "shaw": "no Shaw tables",
                "huang": "no Huang tables",
            },
            requires=frozenset({"t5"}),
        )

    def unsupported_case(self, case):
        spec = case.spec
        if _glue.scheme(spec, "t5") is None:
            return None
        if spec.bias:
            return "T5Attention's projections have no biases (PROJ-1 with bias=False only)"
        if spec.effective_scale != 1.0:
            return f"T5Attention does not scale its logits (scale 1), the case scales by {spec.effective_scale:.4g}"
        if spec.causal == _glue.scheme(spec, "t5").bidirectional:
            return "T5 decoders are causal and unidirectional, encoders neither (is_decoder sets both)"
        return None

    def build(self, spec, dtype, device):
        from .torch_bias_libs import t5_layer

        return t5_layer(spec).to(device=device, dtype=_torch.torch_dtype(dtype)).eval()

    def to_table(self, rel_b):  # relative_attention_bias (N, H): rel_b transposed, the same bucket order
        return np.asarray(rel_b).T

    def from_table(self, table):
        return np.asarray(table).T

    def _mask(self, spec, inputs, x):
        """T5's additive mask: finfo(dtype).min where a key is masked (the mask input) or in the future (a
        decoder); (B, 1, Lq, Lk), or None when every key is allowed."""
        import torch

        B, L = x.shape[:2]
        if not spec.causal and inputs.get("mask") is None:
            return None
        allowed = _torch.allowed_mask(spec, inputs, B, 1, L, L, str(x.device))
        return torch.zeros((B, 1, L, L), dtype=x.dtype, device=x.device).masked_fill(~allowed, torch.finfo(x.dtype).min)

    def call(self, spec, m, t, inputs, *, training):
        x = t["query"]
        mask = self._mask(spec, inputs, x)
        if training or not spec.causal:
            out, _, weights = m(x, mask=mask)
            return out, weights
        return self._decode(m, x, mask)

    def _decode(self, m, x, mask):
        """A decoder as T5 generates: the first L - 1 queries in one call that fills the cache, then one cached
        step for the last; the weights of the two calls stacked (the prefill's last key column is 0, causal)."""
        import torch
        from transformers import DynamicCache, EncoderDecoderCache

        L = x.shape[1]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        first, _, w_first = m(x[:, : L - 1], mask=None if mask is None else mask[:, :, : L - 1, : L - 1], cache=cache)
        last, _, w_last = m(x[:, L - 1 :], mask=None if mask is None else mask[:, :, L - 1 :, :], cache=cache)
        w_first = torch.nn.functional.pad(w_first, (0, 1))
        return torch.cat([first, last], dim=1), torch.cat([w_first, w_last], dim=2)
