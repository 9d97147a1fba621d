"""``jax.nn.dot_product_attention`` with the canonical projections around it.

Layout (B, T, N, H) — sequence before heads. Certifies the subset it
supports: scale, boolean masks, bias, top-left causal, grouped key/value
heads (HEAD-3: K < N key heads, query head n reading key head n // G, as
its (B, T, K, G, H) reshape does) and windows at default positions
(WINDOW-1: ``local_window_size``, or inside the mask when one is given). No
relative positions, no keep masks, no weights, no value head size of its own
(its value must have the key's shape), no softcap.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax
from .base import PLAIN_FEATURES, Capabilities

DENSE = ("query", "key", "value", "bias")


def local_window(spec, Lq: int, Lk: int):
    """WINDOW-1 as ``local_window_size=(left, right)``: key j allowed for query i iff i - left <= j <= i + right.

    That is -left <= delta <= right at default positions (delta = j - i, POS-3). An unbounded side (None)
    becomes max(Lq, Lk), which no distance between these queries and keys reaches.
    """
    if spec.window is None:
        return None
    return tuple(max(Lq, Lk) if side is None else side for side in spec.window)


class JaxNNAdapter(_jax.JaxAdapter):
    name = "jax-nn"
    description = "jax.nn.dot_product_attention (xla) + canonical projections"

    def capabilities(self):
        self.environment()
        return Capabilities(
            devices=_jax.devices(),
            features=PLAIN_FEATURES | {"dropout-spec", "grouped-kv-heads", "window"},
            weights=False,
            unsupported=_jax.UNSUPPORTED,
            notes={
                "positions": "no position input; is_causal is top-left",
                "shaw": "no relative positions",
                "huang": "no relative positions",
                "mask-fill": "its own fill value",
                "dropout-keep": "no dropout",
                "value-head-dim": "value must have the key's shape (B, S, K, H): one head size for q, k and v",
                "softcap": "no logit soft-capping option (nor a score hook to add one)",
            },
        )

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _compiled(spec, has_mask: bool, precision):
        """(out, grads) = fwd_vjp(leaves, mask, grad_out), jitted per spec and mask presence."""
        import jax
        import jax.numpy as jnp

        H, Hkv, d = spec.num_heads, spec.kv_heads, spec.head_dim

        def f(t, mask):
            x = t["query"]
            key = t.get("key", x)
            value = t.get("value", key)
            B, Lq, D = x.shape
            Lk = key.shape[1]
            with jax.default_matmul_precision(precision):

                def proj(a, w, b, heads):
                    y = a @ t[w]
                    return (y + t[b] if b in t else y).reshape(B, -1, heads, d)  # (B, L, N|K, H)

                q = proj(x, "wq", "bq", H)  # (B, T, N, H)
                k, v = proj(key, "wk", "bk", Hkv), proj(value, "wv", "bv", Hkv)  # (B, S, K, H), HEAD-3
                bias = t.get("bias")
                if bias is not None:
                    bias = jnp.broadcast_to(bias, (B, H, Lq, Lk))
                o = jax.nn.dot_product_attention(
                    q,
                    k,
                    v,
                    bias=bias,
                    mask=mask,
                    scale=spec.effective_scale,
                    is_causal=spec.causal and not has_mask,
                    local_window_size=None if has_mask else local_window(spec, Lq, Lk),
                )
                out = o.reshape(B, Lq, D) @ t["wo"]
                return out + t["bo"] if "bo" in t else out

        def fwd_vjp(t, mask, g):
            # One function for both, so each shape compiles once: a forward call
            # passes a zero upstream gradient and ignores the gradients.
            out, pullback = jax.vjp(lambda t: f(t, mask), t)
            return out, pullback(g)[0]

        return jax.jit(fwd_vjp)

    @staticmethod
    def _key(spec, inputs, device):
        dtype = inputs["query"].dtype.name
        return spec, inputs.get("mask") is not None, _jax.matmul_precision(dtype)

    def _mask(self, spec, inputs):
        if inputs.get("mask") is None:
            return None
        B, Lq, _ = inputs["query"].shape
        Lk = inputs.get("key", inputs["query"]).shape[1]
        return _jax.allowed_mask(spec, inputs, B, spec.num_heads, Lq, Lk)

    def _leaves(self, params, inputs, device):
        # Self-attention is passed as explicit key = value = query leaves, so that
        # forward and vjp share one compiled function per shape.
        inputs = {"key": inputs["query"], **inputs}
        inputs.setdefault("value", inputs["key"])
        return {n: _jax.to_jax(a, device) for n, a in {**params, **inputs}.items() if n in DENSE or n in params}

    def forward(self, spec, params, inputs, *, device, need_weights):
        fwd_vjp = self._compiled(*self._key(spec, inputs, device))
        x = inputs["query"]
        zeros = _jax.to_jax(np.zeros(x.shape, x.dtype), device)
        out, _ = fwd_vjp(self._leaves(params, inputs, device), self._mask(spec, inputs), zeros)
        return {"out": _jax.to_numpy(out)}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        fwd_vjp = self._compiled(*self._key(spec, inputs, device))
        _, grads = fwd_vjp(
            self._leaves(params, inputs, device), self._mask(spec, inputs), _jax.to_jax(grad_out, device)
        )
        return {n: _jax.to_numpy(g) for n, g in grads.items()}
