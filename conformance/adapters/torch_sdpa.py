"""PyTorch ``F.scaled_dot_product_attention`` with the canonical projections around it.

Certifies SDPA's core for the subset it supports: scale, boolean and float
masks, top-left causal, grouped key/value heads (HEAD-3, its ``enable_gqa``:
query head h reads key/value head h // G, the spec's contiguous groups), a
value head size of its own (HEAD-4), and windows (WINDOW-1, through its
boolean mask). No relative positions, no soft cap, no explicit keep masks,
no weights returned.
"""

from __future__ import annotations

from . import _torch
from .base import PLAIN_FEATURES, Capabilities


class TorchSDPAAdapter(_torch.TorchAdapter):
    name = "torch-sdpa"
    description = "torch.nn.functional.scaled_dot_product_attention + canonical projections"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=PLAIN_FEATURES | {"dropout-spec", "grouped-kv-heads", "value-head-dim", "window"},
            weights=False,
            notes={
                "positions": "no position input; is_causal is top-left",
                "shaw": "no relative positions",
                "huang": "no relative positions",
                "mask-fill": "masked logits are -inf",
                "dropout-keep": "dropout uses its own RNG",
                "softcap": "F.scaled_dot_product_attention has no score modification: SOFTCAP-1 caps the score "
                "before the masks (FlexAttention's score_mod can, SDPA cannot)",
            },
        )

    def _run(self, spec, params, inputs, device, leaves=None):
        import torch.nn.functional as F

        t = leaves or {
            n: _torch.to_torch(a, device)
            for n, a in {**params, **inputs}.items()
            if n not in ("mask", "q_positions", "k_positions", "dropout_keep")
        }
        x = t["query"]
        key = t.get("key", x)
        value = t.get("value", key)
        B, Lq, D = x.shape
        Lk = key.shape[1]
        H, Hkv = spec.num_heads, spec.kv_heads

        def proj(a, w, b, heads):
            y = a @ t[w]
            return (y + t[b] if b in t else y).view(B, -1, heads, t[w].shape[1] // heads).transpose(1, 2)

        q = proj(x, "wq", "bq", H)  # (B, H, Lq, d)
        k, v = proj(key, "wk", "bk", Hkv), proj(value, "wv", "bv", Hkv)  # (B, Hkv, Lk, d), (B, Hkv, Lk, dv)
        sdpa = dict(scale=spec.effective_scale, enable_gqa=Hkv != H)  # HEAD-3: contiguous groups
        has_mask = inputs.get("mask") is not None or spec.window is not None  # WINDOW-1 goes in as a mask
        bias = t.get("bias")
        if bias is not None:
            allowed = _torch.allowed_mask(spec, inputs, B, H, Lq, Lk, device)
            attn_mask = bias.masked_fill(~allowed, float("-inf"))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **sdpa)
        elif has_mask:
            attn_mask = _torch.allowed_mask(spec, inputs, B, H, Lq, Lk, device)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **sdpa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal, **sdpa)
        merged = o.transpose(1, 2).reshape(B, Lq, H * spec.v_head_dim)  # (B, Lq, H * dv)
        out = merged @ t["wo"]
        return out + t["bo"] if "bo" in t else out

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        with torch.no_grad():
            return {"out": _torch.to_numpy(self._run(spec, params, inputs, device))}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        leaves = {
            n: _torch.to_torch(a, device, requires_grad=True)
            for n, a in {**params, **inputs}.items()
            if n not in ("mask", "q_positions", "k_positions", "dropout_keep")
        }
        out = self._run(spec, params, inputs, device, leaves)
        out.backward(_torch.to_torch(grad_out, device))
        return {n: _torch.to_numpy(leaf.grad) for n, leaf in leaves.items()}
