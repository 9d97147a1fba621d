"""The relative position biases people run in PyTorch: x-transformers', T5's, and BLOOM's, MPT's and Falcon's ALiBi.

Each library's bias is the scheme term of REL-3 (3): the adapter hands the
glue (``_glue``) a ``position_bias(t, q_positions, k_positions)`` built
from the library and the glue does the rest from the spec, so a deviation
is the bias's. Modules are built from their own constructors in float32
and cast with ``.to(dtype)`` (float64 included), the way users get a
16-bit model, so what the cast does to a slope buffer or a table is part
of what is certified. A table ``rel_b`` (H, R) goes in through
``torch.func.functional_call`` as the module's own embedding weight
(R, H), so its gradient is the library's.

- ``xt-alibi``: ``AlibiPositionalBias(heads)`` (its own slope schedule;
  explicit slopes through ``slopes=``), called as
  ``forward_custom_pos(q_positions, k_positions)``: ``-m |j - i|``.
- ``xt-t5``: ``RelativePositionBias(scale=1.0, causal, num_buckets,
  max_distance, heads)``. At the positions it makes itself (queries at the
  end of the keys, ``arange(Lk - Lq, Lk)``) it is called as ``forward(Lq,
  Lk)``; at other positions its own ``_relative_position_bucket`` and
  embedding run on ``k - q``. x-transformers' ``AttentionLayers`` builds
  it with ``scale = dim_head ** 0.5``: a T5 table loads into it divided by
  ``sqrt(d)`` (spec/comparison.md).
- ``hf-t5-bias``: ``T5Attention.compute_bias`` of a layer built from
  ``T5Config`` (``is_decoder`` = not bidirectional): queries at
  ``arange(Lq) + past_seen_tokens``, keys at ``arange(Lk)``; positions
  that are not of that form go through its ``_relative_position_bucket``
  on ``k - q`` and its embedding.
- ``bloom-alibi``, ``mpt-alibi``, ``falcon-alibi``: the models' builders,
  ``build_alibi_tensor(attention_mask, H, dtype)`` (BLOOM, Falcon) and
  ``build_mpt_alibi_tensor(H, Lk)``, as their attention layers add them:
  one row ``m * j`` over the key index (MPT: ``m * (j - (Lk - 1))``)
  broadcast over the queries, which is the linear form (ALIBI-3) up to a
  per-row constant. Falcon's eager attention multiplies scores plus bias
  by ``1 / sqrt(d)`` (``(q k^T + alibi) * inv_norm_factor``), so its bias
  enters scaled. The builders take no positions: keys at ``arange(Lk)``.

Axis legend (AXES-1): B, H, Lq, Lk, d; R table rows.
"""

from __future__ import annotations

import numpy as np

from . import _glue, _torch
from .base import Capabilities
from .hf_rope import transformers_unavailable

#: The release the x-transformers adapters were certified against (the pin of the extra).
XT_PIN = "x-transformers==2.31.10"


def _default_keys(inputs: dict, Lk: int) -> bool:
    """True when the keys sit at arange(Lk) in every batch row (the builders' and forward(i, j)'s keys)."""
    kp = inputs.get("k_positions")
    return kp is None or bool(np.all(np.asarray(kp) == np.arange(Lk)))


def _end_aligned_queries(inputs: dict, Lq: int, Lk: int) -> bool:
    """True when the queries sit at arange(Lk - Lq, Lk) in every batch row (x-transformers' forward(i, j))."""
    qp = inputs.get("q_positions")
    qp = np.arange(Lq) if qp is None else np.asarray(qp)
    return bool(np.all(qp == np.arange(Lk - Lq, Lk)))


class _BiasAdapter(_torch.TorchAdapter):
    """A library's position bias in the glue; subclasses build ``bias_fn(spec, inputs, dtype, device)``."""

    scheme: str = ""  # the scheme name it certifies (REL-3)
    features: frozenset = frozenset()
    notes: dict = {}

    def capabilities(self):
        notes = {
            "shaw": "a position-bias library: no Shaw tables",
            "huang": "a position-bias library: no Huang tables",
            **self.notes,
        }
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset(_glue.GLUE_FEATURES | self.features),
            notes=notes,
            requires=frozenset({self.scheme}),
        )

    def environment(self):
        import transformers

        return {**_torch.pin_numerics(), "transformers": transformers.__version__}

    def bias_fn(self, spec, inputs: dict, dtype: str, device: str):
        """position_bias(t, q_positions, k_positions) -> (1|B, H, Lq, Lk) in the library's dtype."""
        raise NotImplementedError

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        bias = self.bias_fn(spec, inputs, inputs["query"].dtype.name, device)
        with torch.no_grad():
            return _glue.torch_run(spec, params, inputs, device, position_bias=bias, need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        bias = self.bias_fn(spec, inputs, inputs["query"].dtype.name, device)
        return _glue.torch_run(spec, params, inputs, device, position_bias=bias, need_weights=False, grad_out=grad_out)


def with_table(module, weight: str, rel_b, method: str, *args, **kwargs):
    """``module.method(*args, **kwargs)`` with the embedding weight named ``weight`` (R, H) replaced by the
    canonical table ``rel_b`` (H, R) transposed, through ``torch.func.functional_call``: the library's own
    lookup, and ``rel_b``'s gradient is the one autograd takes through it."""
    import torch
    from torch.func import functional_call

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self):
            return getattr(self.module, method)(*args, **kwargs)

    return functional_call(Call(), {f"module.{weight}": rel_b.T}, (), strict=False)


def pair_deltas(qp, kp, device):
    """POS-2: key minus query position of every pair, (1|B, Lq, Lk) int64, from (1|B, L) positions."""
    return _torch.to_torch(kp[:, None, :] - qp[:, :, None], device)


def bucket_bias(module, rel_b, buckets):
    """(1|B, H, Lq, Lk): the module's own ``relative_attention_bias`` embedding (both T5 libraries name it so)
    read at ``buckets`` (1|B, Lq, Lk), with the canonical table ``rel_b`` (H, N) as its weight."""
    values = with_table(module, "relative_attention_bias.weight", rel_b, "relative_attention_bias", buckets)
    return values.permute(0, 3, 1, 2)


# ------------------------------------------------------------------ x-transformers
def xt_unavailable():
    missing = _torch.torch_available()
    if missing:
        return missing
    try:
        import x_transformers  # noqa: F401
    except ImportError as e:
        return f"x-transformers is not installed ({e}); pip install {XT_PIN}"
    return None


class _XTAdapter(_BiasAdapter):
    def unavailable(self):
        return xt_unavailable()

    def environment(self):
        from importlib import metadata

        return {**_torch.pin_numerics(), "x-transformers": metadata.version("x-transformers")}


class XTAlibiAdapter(_XTAdapter):
    name = "xt-alibi"
    description = "x-transformers AlibiPositionalBias (forward_custom_pos) in the glue"
    scheme = "alibi"
    features = frozenset({"alibi"})
    notes = {"alibi-linear": "AlibiPositionalBias adds -m |j - i| only (ALIBI-3's symmetric form)"}

    def bias_fn(self, spec, inputs, dtype, device):
        from x_transformers.x_transformers import AlibiPositionalBias

        alibi = _glue.scheme(spec, "alibi")
        H = spec.num_heads
        own = alibi.slopes is None and alibi.max_bias == 8.0  # the paper's schedule: the library's own slopes
        m = AlibiPositionalBias(heads=H, total_heads=H, slopes=None if own else list(alibi.slopes_for(H)))
        m = m.to(device=device, dtype=_torch.torch_dtype(dtype))

        def bias(t, qp, kp):
            q, k = _torch.to_torch(qp, device), _torch.to_torch(kp, device)
            return m.forward_custom_pos(q, k)  # (1|B, H, Lq, Lk)

        return bias


class XTT5Adapter(_XTAdapter):
    name = "xt-t5"
    description = "x-transformers RelativePositionBias (scale 1) in the glue"
    scheme = "t5"
    features = frozenset({"t5", "t5-causal"})

    def bias_fn(self, spec, inputs, dtype, device):
        from x_transformers.x_transformers import RelativePositionBias

        t5 = _glue.scheme(spec, "t5")
        m = RelativePositionBias(
            scale=1.0,
            causal=not t5.bidirectional,
            num_buckets=t5.num_buckets,
            max_distance=t5.max_distance,
            heads=spec.num_heads,
        ).to(device=device, dtype=_torch.torch_dtype(dtype))
        Lq = inputs["query"].shape[1]
        Lk = inputs.get("key", inputs["query"]).shape[1]
        own = _default_keys(inputs, Lk) and _end_aligned_queries(inputs, Lq, Lk)

        def bias(t, qp, kp):
            if own:  # the positions x-transformers makes: its forward(i, j)
                return with_table(m, "relative_attention_bias.weight", t["rel_b"], "forward", Lq, Lk)[None]
            buckets = m._relative_position_bucket(
                pair_deltas(qp, kp, device), causal=m.causal, num_buckets=m.num_buckets, max_distance=m.max_distance
            )
            return bucket_bias(m, t["rel_b"], buckets) * m.scale

        return bias


# ----------------------------------------------------------------------- HF T5
class HFT5BiasAdapter(_BiasAdapter):
    name = "hf-t5-bias"
    description = "transformers T5Attention.compute_bias (and its bucket function) in the glue"
    scheme = "t5"
    features = frozenset({"t5", "t5-causal"})

    def unavailable(self):
        return transformers_unavailable(major=5)

    def bias_fn(self, spec, inputs, dtype, device):
        layer = t5_layer(spec).to(device=device, dtype=_torch.torch_dtype(dtype))
        Lq = inputs["query"].shape[1]
        Lk = inputs.get("key", inputs["query"]).shape[1]
        qp = _glue.positions(inputs, "q_positions", Lq)
        start = int(qp[0, 0])
        own = _default_keys(inputs, Lk) and bool(np.all(qp == np.arange(start, start + Lq)))

        def bias(t, qp, kp):
            if own:  # the positions compute_bias makes: arange(Lq) + past_seen_tokens, keys arange(Lk)
                return with_table(
                    layer,
                    "relative_attention_bias.weight",
                    t["rel_b"],
                    "compute_bias",
                    Lq,
                    Lk,
                    device=device,
                    past_seen_tokens=start,
                )
            buckets = layer._relative_position_bucket(
                pair_deltas(qp, kp, device),
                bidirectional=not layer.is_decoder,
                num_buckets=layer.relative_attention_num_buckets,
                max_distance=layer.relative_attention_max_distance,
            )
            return bucket_bias(layer, t["rel_b"], buckets)

        return bias


def t5_config(spec):
    """T5Config of the spec: d_model D, d_kv d, heads, the buckets; is_decoder = not bidirectional."""
    from transformers import T5Config

    t5 = _glue.scheme(spec, "t5")
    return T5Config(
        d_model=spec.model_dim,
        d_kv=spec.head_dim,
        num_heads=spec.num_heads,
        relative_attention_num_buckets=t5.num_buckets,
        relative_attention_max_distance=t5.max_distance,
        dropout_rate=0.0,
        is_decoder=not t5.bidirectional,
        attn_implementation="eager",
    )


def t5_layer(spec):
    """One T5Attention with its relative bias (float32, eval mode) of the spec."""
    from transformers.models.t5.modeling_t5 import T5Attention

    return T5Attention(t5_config(spec), has_relative_attention_bias=True, layer_idx=0).eval()


# ------------------------------------------------------------- ALiBi builders
class _AlibiBuilderAdapter(_BiasAdapter):
    """A model's ALiBi builder: one row over the keys, broadcast over the queries (ALIBI-3's linear form)."""

    scheme = "alibi"
    features = frozenset({"alibi", "alibi-linear"})
    notes = {}

    def unavailable(self):
        return transformers_unavailable()

    def unsupported_case(self, case):
        alibi = _glue.scheme(case.spec, "alibi")
        if alibi is not None and (alibi.slopes is not None or alibi.max_bias != 8.0):
            return "the builder makes its own slopes (max_bias 8, ALIBI-2) and takes none of the call's"
        if not _glue.default_keys(case):
            return "the builder puts the keys at arange(Lk): it takes no key positions"
        return None

    def row(self, spec, B: int, Lk: int, dtype: str, device: str):
        """The builder's bias, (B|1, H, 1, Lk) in ``dtype``."""
        raise NotImplementedError

    def bias_fn(self, spec, inputs, dtype, device):
        B = inputs["query"].shape[0]
        Lk = inputs.get("key", inputs["query"]).shape[1]
        if not _default_keys(inputs, Lk):
            raise ValueError(f"k_positions: {self.name}'s builder puts the keys at arange(Lk)")
        row = self.row(spec, B, Lk, dtype, device)
        return lambda t, qp, kp: row


class BloomAlibiAdapter(_AlibiBuilderAdapter):
    name = "bloom-alibi"
    description = "transformers BLOOM build_alibi_tensor (m * j over the keys) in the glue"

    def row(self, spec, B, Lk, dtype, device):
        import torch
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor

        mask = torch.ones((B, Lk), dtype=torch.long, device=device)  # every key present: positions arange(Lk)
        return build_alibi_tensor(mask, spec.num_heads, _torch.torch_dtype(dtype)).view(B, spec.num_heads, 1, Lk)


class MPTAlibiAdapter(_AlibiBuilderAdapter):
    name = "mpt-alibi"
    description = "transformers MPT build_mpt_alibi_tensor (m * (j - (Lk - 1))) in the glue"

    def row(self, spec, B, Lk, dtype, device):
        from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

        return build_mpt_alibi_tensor(spec.num_heads, Lk, device=device)[None]  # float32, as MptModel adds it


class FalconAlibiAdapter(_AlibiBuilderAdapter):
    name = "falcon-alibi"
    description = "transformers Falcon build_alibi_tensor as FalconAttention adds it ((q k^T + alibi) / sqrt(d))"

    def row(self, spec, B, Lk, dtype, device):
        import math

        import torch
        from transformers.models.falcon.modeling_falcon import build_alibi_tensor

        mask = torch.ones((B, Lk), dtype=torch.long, device=device)
        alibi = build_alibi_tensor(mask, spec.num_heads, _torch.torch_dtype(dtype)).view(B, spec.num_heads, 1, Lk)
        return alibi * (1.0 / math.sqrt(spec.head_dim))  # FalconAttention's inv_norm_factor on scores + alibi
