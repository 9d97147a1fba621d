"""x-transformers' attention core ``Attend``, with its own ALiBi and T5 biases, around the canonical projections.

``Attend(causal, scale, softclamp_logits, logit_softclamp_value)`` takes
per-head q, k, v (B, heads, L, d) and computes ``softmax(s q k^T +
attn_bias)`` with its boolean ``mask`` (True = attend), its causal rule and
its fully masked rows zeroed, then the values. The adapter makes q, k, v
with the canonical projections and head split (PROJ-1, HEAD-1) in plain
torch, as x-transformers' ``Attention`` does with its ``to_q``/``to_k``/
``to_v`` linears, and applies ``wo``, ``bo`` after it (OUT-1). What is
certified is everything between: the scale, the mask and causality, the
bias input and a scheme's bias as ``attn_bias``, grouped key/value heads,
the soft clamp, the softmax and its empty rows.

The bias of an ALiBi or T5 case is x-transformers' own module,
``AlibiPositionalBias`` or ``RelativePositionBias`` (scale 1), exactly as
the ``xt-alibi`` and ``xt-t5`` adapters build it (``torch_bias_libs``),
added to the bias input. ``Attend`` takes no positions of its own: its
causal rule is ``j > i + (Lk - Lq)`` masked (bottom-right), and it drops
the rule for a single query (a cached decoding step).

Axis legend (AXES-1): B, H, Lq, Lk, D, d; Hkv key/value heads.
"""

from __future__ import annotations

import numpy as np

from . import _glue, _torch
from .base import Capabilities
from .torch_bias_libs import XTAlibiAdapter, XTT5Adapter, xt_unavailable


class XTAttendAdapter(_torch.TorchAdapter):
    name = "xt-attend"
    description = "x-transformers Attend (its mask, causal rule, soft clamp; its ALiBi / T5 biases) between projections"

    def __init__(self):
        self._biases = {"alibi": XTAlibiAdapter(), "t5": XTT5Adapter()}

    def unavailable(self):
        return xt_unavailable()

    def environment(self):
        from importlib import metadata

        return {**_torch.pin_numerics(), "x-transformers": metadata.version("x-transformers")}

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset(
                {
                    "cross-attention",
                    "custom-scale",
                    "no-projection-bias",
                    "causal",
                    "mask",
                    "bias",
                    "grouped-kv-heads",
                    "value-head-dim",
                    "softcap",
                    "alibi",
                    "t5",
                    "t5-causal",
                    "positions",
                }
            ),
            notes={
                "shaw": "Attend has no Shaw tables",
                "huang": "Attend has no Huang tables",
                "rope": "Attend takes q and k already rotated (the xt-rope adapter certifies the rotation)",
                "alibi-linear": "AlibiPositionalBias adds -m |j - i| only (ALIBI-3's symmetric form)",
                "mask-fill": "Attend fills masked logits with -finfo.max, and zeroes fully masked rows",
                "dropout-keep": "Attend's dropout draws from torch's RNG",
                "dropout-spec": "Attend's dropout draws from torch's RNG",
                "window": "Attend has no sliding window",
                "swin": "no Swin bias in x-transformers",
            },
        )

    def unsupported_case(self, case):
        if "positions" in case.features() and case.spec.relative is None:
            return "Attend takes no positions: only x-transformers' position biases read them"
        return None

    def _run(self, spec, params, inputs, device, *, grad_out=None, need_weights=False):
        import torch
        from x_transformers.attend import Attend

        wanted = grad_out is not None
        skip = ("mask", "q_positions", "k_positions")
        t = {
            n: _torch.to_torch(a, device, requires_grad=wanted)
            for n, a in {**params, **inputs}.items()
            if n not in skip
        }
        x = t["query"]
        key = t.get("key", x)
        value = t.get("value", key)
        B, Lq, _ = x.shape
        Lk = key.shape[1]

        def proj(a, w, b, heads):  # PROJ-1, HEAD-1
            y = a @ t[w]
            y = y + t[b] if b in t else y
            return y.view(B, a.shape[1], heads, -1).transpose(1, 2)

        q, k = proj(x, "wq", "bq", spec.num_heads), proj(key, "wk", "bk", spec.kv_heads)
        v = proj(value, "wv", "bv", spec.kv_heads)
        attend = Attend(
            causal=spec.causal,
            scale=spec.effective_scale,
            softclamp_logits=spec.softcap is not None,
            logit_softclamp_value=spec.softcap or 50.0,
        )
        bias = t.get("bias")
        scheme = getattr(spec.relative, "name", None)
        if scheme is not None:  # x-transformers' own module, as xt-alibi / xt-t5 build it
            fn = self._biases[scheme].bias_fn(spec, inputs, inputs["query"].dtype.name, device)
            qp, kp = _glue.positions(inputs, "q_positions", Lq), _glue.positions(inputs, "k_positions", Lk)
            bias = fn(t, qp, kp) if bias is None else fn(t, qp, kp) + bias
        mask = inputs.get("mask")
        if mask is not None:  # Attend reads a 2-D mask as key padding (B, Lk): hand it the 4-D broadcast form
            mask = np.asarray(mask)
            mask = _torch.to_torch(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), device)
        out, inter = attend(q, k, v, mask=mask, attn_bias=bias)
        out = out.transpose(1, 2).reshape(B, Lq, -1) @ t["wo"]
        out = out + t["bo"] if "bo" in t else out
        if not wanted:
            res = {"out": _torch.to_numpy(out)}
            if need_weights:
                res["weights"] = _torch.to_numpy(inter.post_softmax_attn)
            return res
        names = list(t)
        grads = torch.autograd.grad(out, [t[n] for n in names], _torch.to_torch(grad_out, device), allow_unused=True)
        return {n: _torch.to_numpy(g if g is not None else torch.zeros_like(t[n])) for n, g in zip(names, grads)}

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        with torch.no_grad():
            return self._run(spec, params, inputs, device, need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        return self._run(spec, params, inputs, device, grad_out=grad_out)
