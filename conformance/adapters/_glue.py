"""The attention around an outside position term: canonical projections, the library's term, a plain core.

An outside RoPE (Hugging Face's ``apply_rotary_pos_emb``, torchtune's
``RotaryPositionalEmbeddings``, keras-hub's ``RotaryEmbedding``, ...) is only
the q/k transform of REL-3 (1); an outside position bias (x-transformers'
``AlibiPositionalBias``, T5's ``compute_bias``, BLOOM's
``build_alibi_tensor``, ...) is only the scheme term of REL-3 (3). Its
adapter hands this module a ``rotate(x, positions)`` or a
``position_bias(t, q_positions, k_positions)`` built from the library, and
this module does the rest in plain framework operations written from the
spec: the projections (PROJ-1), the head split (HEAD-1, HEAD-3), the scaled
logits (SCALE-2), the position bias unscaled (SCALE-4) and the bias input
(BIAS-1), the allowed keys from the mask, causality and the positions
(MASK-4, CAUSAL-1, POS-2), a softmax with exact zeros (MASK-5), dead keys'
rows zeroed before the projections (MASK-7), the keep mask (DROP-1), the
values and the output projection (OUT-1). So a deviation such an adapter
reports is the library's rotation's or bias's, nothing else's.

``rotate(x, positions) -> x'``: x (B, heads, L, d) in the input dtype,
positions an int64 array (1|B, L) (POS-1); the rotated q or k of the same
shape. ``position_bias(t, q_positions, k_positions) -> (1|B, H, Lq, Lk)``:
``t`` the call's tensors (a table ``t["rel_b"]`` among them, recording
gradients when they are asked for), the positions as for ``rotate``.
Axis legend (AXES-1): B, H, Lq, Lk, D, d; Hkv key/value heads.
"""

from __future__ import annotations

import numpy as np

from .base import PLAIN_FEATURES

#: What the glue computes besides the rotation (the adapters add their RoPE features).
GLUE_FEATURES = PLAIN_FEATURES | {"positions", "grouped-kv-heads", "value-head-dim", "dropout-spec", "dropout-keep"}
#: A glue adapter certifies a rotation: cases without RoPE would check the glue alone (Capabilities.requires).
ROPE_ONLY = frozenset({"rope"})


def positions(inputs: dict, name: str, length: int) -> np.ndarray:
    """POS-1: the (1|B, L) int64 positions of ``inputs[name]``, arange(L) when absent."""
    p = inputs.get(name)
    p = np.arange(length) if p is None else np.asarray(p)
    return np.asarray(p, dtype=np.int64).reshape((-1, length))


def interleaved_orders(rope, d: int):
    """(to_interleaved, to_half): channel orders of one head that carry a half-layout Rope's q or k into the
    interleaved layout and back (ROPE-8: ``x_half = x_interleaved[..., to_half]``), for a library that has
    only the interleaved layout; an exact reordering, no arithmetic."""
    from spec import rope_permutation

    to_half = np.asarray(rope_permutation(1, d, rope.rotated(d)))
    return np.argsort(to_half), to_half


def scheme(spec, name: str):
    """``spec.relative`` when it is the scheme ``name`` (REL-3: schemes are told apart by name), else None."""
    return spec.relative if getattr(spec.relative, "name", None) == name else None


def default_keys(case) -> bool:
    """True when the case's calls leave the keys at arange(Lk) (POS-1), for libraries that take no key
    positions (ALiBi builders): the recipes decide, so one draw tells."""
    return "k_positions" not in case.draw(np.random.default_rng(0))


def allowed_keys(spec, inputs: dict) -> np.ndarray:
    """MASK-4: the allowed keys (B, H, Lq, Lk) from the mask, -inf bias entries (BIAS-2) and causality on
    the positions' distance (CAUSAL-1, POS-2); computed once per call, for the core and for MASK-7."""
    B, Lq = inputs["query"].shape[:2]
    Lk = inputs.get("key", inputs["query"]).shape[1]
    allowed = np.ones((B, spec.num_heads, Lq, Lk), dtype=bool)
    if inputs.get("mask") is not None:
        allowed = allowed & np.asarray(inputs["mask"])
    if inputs.get("bias") is not None:
        allowed = allowed & (np.asarray(inputs["bias"]).astype(np.float64) != -np.inf)
    if spec.causal:
        qp, kp = positions(inputs, "q_positions", Lq), positions(inputs, "k_positions", Lk)
        allowed = allowed & ((kp[:, None, :] - qp[:, :, None]) <= 0)[:, None]
    return allowed


def without_dead_keys(spec, inputs: dict, allowed: np.ndarray) -> dict:
    """MASK-7: the key and value rows of keys that no query of any head may attend, set to 0.

    ``weights @ v`` multiplies a dead key's weight 0 by its value row, and
    0 * NaN is NaN; the rotation works row by row, so zeroing those rows
    before the call hides nothing of the library's.
    """
    if inputs.get("key") is None:
        return inputs
    dead = ~allowed.any(axis=(1, 2))  # (B, Lk)
    if not dead.any():
        return inputs
    out = dict(inputs)
    for name in ("key", "value"):
        if out.get(name) is not None:
            rows = np.array(out[name])
            rows[dead] = 0
            out[name] = rows
    return out


# ---------------------------------------------------------------------- torch
def torch_forward(spec, t: dict, inputs: dict, allowed, rotate=None, *, need_weights: bool, position_bias=None):
    """out (B, Lq, D) [and weights (B, H, Lq, Lk)] from the tensors ``t`` (params and query/key/value) and the
    allowed keys (``allowed_keys``, a bool tensor); ``rotate`` and ``position_bias`` as in the module's text
    (None: no such term)."""
    import torch

    from . import _torch

    x = t["query"]
    key = t.get("key", x)
    value = t.get("value", key)
    B, Lq, _ = x.shape
    Lk = key.shape[1]
    H, Hkv, G = spec.num_heads, spec.kv_heads, spec.group_size

    def proj(a, w, b, heads):  # PROJ-1, HEAD-1: (B, L, heads * c) -> (B, heads, L, c)
        y = a @ t[w]
        y = y + t[b] if b in t else y
        return y.view(B, a.shape[1], heads, -1).transpose(1, 2)

    qp, kp = positions(inputs, "q_positions", Lq), positions(inputs, "k_positions", Lk)
    q, k = proj(x, "wq", "bq", H), proj(key, "wk", "bk", Hkv)
    if rotate is not None:  # REL-3 (1)
        q, k = rotate(q, qp), rotate(k, kp)
    v = proj(value, "wv", "bv", Hkv)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # HEAD-3: contiguous groups
    logits = spec.effective_scale * (q @ k.transpose(-1, -2))  # SCALE-2
    if position_bias is not None:  # REL-3 (3), SCALE-4: unscaled, in the library's dtype
        logits = logits + position_bias(t, qp, kp)
    if "bias" in t:  # BIAS-1 (its -inf entries are in ``allowed``, BIAS-2)
        logits = logits + t["bias"]
    stat = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # PREC-4
    z = torch.where(allowed, logits.to(stat), -torch.inf)
    peak = z.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0).detach()
    e = torch.where(allowed, torch.exp(z - peak), 0.0)
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)  # MASK-5: empty rows are 0
    dropped = w
    if inputs.get("dropout_keep") is not None:  # DROP-1
        keep = _torch.to_torch(inputs["dropout_keep"], x.device)
        dropped = torch.where(keep, w / (1.0 - spec.dropout), 0.0)
    o = (dropped @ v.to(stat)).to(x.dtype)  # (B, H, Lq, dv)
    out = o.transpose(1, 2).reshape(B, Lq, -1) @ t["wo"]  # OUT-1
    out = out + t["bo"] if "bo" in t else out
    return (out, w.to(x.dtype)) if need_weights else (out, None)


def torch_run(
    spec, params: dict, inputs: dict, device: str, rotate=None, *, need_weights: bool, grad_out=None, position_bias=None
):
    """forward, or with ``grad_out`` the gradients of <out, grad_out> by autograd (GRAD-1)."""
    import torch

    from . import _torch

    skip = ("mask", "q_positions", "k_positions", "dropout_keep")
    wanted = grad_out is not None
    allowed = allowed_keys(spec, inputs)
    inputs = without_dead_keys(spec, inputs, allowed)
    t = {n: _torch.to_torch(a, device, requires_grad=wanted) for n, a in {**params, **inputs}.items() if n not in skip}
    allowed = _torch.to_torch(allowed, device)
    out, weights = torch_forward(
        spec, t, inputs, allowed, rotate, need_weights=need_weights and not wanted, position_bias=position_bias
    )
    if not wanted:
        res = {"out": _torch.to_numpy(out)}
        if need_weights:
            res["weights"] = _torch.to_numpy(weights)
        return res
    names = list(t)
    grads = torch.autograd.grad(out, [t[n] for n in names], _torch.to_torch(grad_out, device), allow_unused=True)
    return {n: _torch.to_numpy(g if g is not None else torch.zeros_like(t[n])) for n, g in zip(names, grads)}


# ------------------------------------------------------------------------ jax
def jax_forward(spec, t: dict, inputs: dict, allowed, rotate=None, *, need_weights: bool, position_bias=None):
    """The JAX twin of ``torch_forward``; ``t`` holds jax arrays."""
    import jax
    import jax.numpy as jnp

    x = t["query"]
    key = t.get("key", x)
    value = t.get("value", key)
    B, Lq, _ = x.shape
    Lk = key.shape[1]
    H, Hkv, G = spec.num_heads, spec.kv_heads, spec.group_size
    hi = "highest" if x.dtype in (jnp.float32, jnp.float64) else None

    def proj(a, w, b, heads):
        y = jnp.matmul(a, t[w], precision=hi)
        y = y + t[b] if b in t else y
        return y.reshape(B, a.shape[1], heads, -1).transpose(0, 2, 1, 3)

    qp, kp = positions(inputs, "q_positions", Lq), positions(inputs, "k_positions", Lk)
    q, k = proj(x, "wq", "bq", H), proj(key, "wk", "bk", Hkv)
    if rotate is not None:
        q, k = rotate(q, qp), rotate(k, kp)
    v = proj(value, "wv", "bv", Hkv)
    k, v = jnp.repeat(k, G, axis=1), jnp.repeat(v, G, axis=1)
    logits = spec.effective_scale * jnp.matmul(q, k.swapaxes(-1, -2), precision=hi)
    if position_bias is not None:
        logits = logits + position_bias(t, qp, kp)
    if "bias" in t:
        logits = logits + t["bias"]
    stat = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    z = jnp.where(allowed, logits.astype(stat), -jnp.inf)
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(z.max(-1, keepdims=True)), z.max(-1, keepdims=True), 0.0))
    e = jnp.where(allowed, jnp.exp(z - peak), 0.0)
    total = e.sum(-1, keepdims=True)
    w = jnp.where(total > 0, e / jnp.where(total > 0, total, 1.0), 0.0)
    dropped = w
    if inputs.get("dropout_keep") is not None:
        dropped = jnp.where(jnp.asarray(inputs["dropout_keep"]), w / (1.0 - spec.dropout), 0.0)
    o = jnp.matmul(dropped, v.astype(stat), precision=hi).astype(x.dtype)
    out = jnp.matmul(o.transpose(0, 2, 1, 3).reshape(B, Lq, -1), t["wo"], precision=hi)
    out = out + t["bo"] if "bo" in t else out
    return (out, w.astype(x.dtype)) if need_weights else (out, None)


def jax_run(
    spec, params: dict, inputs: dict, device: str, rotate=None, *, need_weights: bool, grad_out=None, position_bias=None
):
    """forward, or with ``grad_out`` the gradients of <out, grad_out> by ``jax.vjp`` (GRAD-1); not jitted."""
    import jax

    from . import _jax

    skip = ("mask", "q_positions", "k_positions", "dropout_keep")
    allowed = allowed_keys(spec, inputs)
    inputs = without_dead_keys(spec, inputs, allowed)
    allowed = _jax.to_jax(allowed, device)
    t = {n: _jax.to_jax(a, device) for n, a in {**params, **inputs}.items() if n not in skip}
    if grad_out is None:
        out, weights = jax_forward(
            spec, t, inputs, allowed, rotate, need_weights=need_weights, position_bias=position_bias
        )
        res = {"out": _jax.to_numpy(out)}
        if need_weights:
            res["weights"] = _jax.to_numpy(weights)
        return res

    def out_of(leaves):
        return jax_forward(spec, leaves, inputs, allowed, rotate, need_weights=False, position_bias=position_bias)[0]

    out, pullback = jax.vjp(out_of, t)
    (grads,) = pullback(_jax.to_jax(np.asarray(grad_out), device).astype(out.dtype))
    return {n: _jax.to_numpy(g) for n, g in grads.items()}
