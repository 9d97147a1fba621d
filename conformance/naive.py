"""A naive attention computed in a given dtype, emulated in NumPy (PREC-2).

This is what a straightforward implementation in dtype ``t`` would compute:
every stored tensor rounded to ``t``, matmuls accumulated in float32 for the
16-bit types (in ``t`` otherwise), the softmax in float32 (in float64 for
float64). Its error against the float64 truth is ``e_base``, the unit of the
tolerance budgets. Two operation orders are provided: order 0 scales the
logits after ``q @ k.T`` and sums every contraction front to back; order 1
scales the query first (as Flax and ONNX do) and sums every contraction back
to front. ``e_base`` is the larger of their errors, so it measures rounding
that depends on the order of operations, as a different implementation's would.

It is written independently of ``numpy_ref.forward`` / ``backward`` (full
``(B, H, Lq, Lk)`` arithmetic, gathers only), and at float64 the test suite
checks it against the reference: a second implementation of the rules.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from numpy_ref.masking import allowed_keys, dead_keys, relative_distance
from numpy_ref.relative import gather_buckets, huang_index, scatter_buckets, shaw_index, sum_to
from spec import AttentionSpec, Shaw

ORDERS = (0, 1)


def storage_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


class Precision:
    """Rounding to the storage dtype ``t`` and arithmetic in the accumulation dtype."""

    def __init__(self, name: str, order: int = 0):
        self.t = storage_dtype(name)
        self.acc = np.dtype(np.float64 if name == "float64" else np.float32)
        self.reverse = order == 1

    def rnd(self, x) -> np.ndarray:
        """Store in t (round), compute on in acc."""
        return np.asarray(x).astype(self.acc).astype(self.t).astype(self.acc)

    def dot(self, a, b) -> np.ndarray:
        """a @ b in acc, contracting front to back or (order 1) back to front."""
        a, b = a.astype(self.acc), b.astype(self.acc)
        if self.reverse:
            a, b = a[..., ::-1], b[..., ::-1, :]
        return a @ b

    def mm(self, a, b) -> np.ndarray:
        """A matmul of t-valued operands, accumulated in acc, rounded to t."""
        return self.rnd(self.dot(a, b))

    def rowsum(self, x) -> np.ndarray:
        """Sum over the key axis, one term after another, in acc (keeps the axis)."""
        x = np.asarray(x, self.acc)
        return np.cumsum(x[..., ::-1] if self.reverse else x, axis=-1)[..., -1:]

    def lin(self, x, w, b) -> np.ndarray:
        y = self.dot(x, w)
        return self.rnd(y if b is None else y + b)


def _split(x, H):  # (B, L, D) -> (B, H, L, d)
    B, L, D = x.shape
    return x.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)


def _merge(x):  # (B, H, L, d) -> (B, L, D)
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)


def _table4(t):
    return t.reshape((1,) * (4 - t.ndim) + t.shape)


def _rel_index(spec: AttentionSpec, delta):
    """(index, valid) of the relative table row per (b, i, j)."""
    r = spec.relative
    if isinstance(r, Shaw):
        return shaw_index(delta, r.max_distance), None
    return huang_index(delta, r.max_len)


def forward(spec: AttentionSpec, params: dict, inputs: dict, dtype: str, order: int = 0):
    """(out, weights, cache) of the naive computation in ``dtype``.

    ``params`` and ``inputs`` hold float64 arrays whose values are already
    representable in ``dtype`` (the stored, rounded inputs).
    """
    P = Precision(dtype, order)
    p = {n: np.asarray(a, P.acc) for n, a in params.items()}
    H = spec.num_heads
    query = np.asarray(inputs["query"], P.acc)
    key = np.asarray(inputs.get("key", inputs["query"]), P.acc)
    value = np.asarray(inputs.get("value", inputs.get("key", inputs["query"])), P.acc)
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    qp = inputs.get("q_positions")
    kp = inputs.get("k_positions")
    qp = np.arange(Lq)[None] if qp is None else np.asarray(qp).reshape(-1, Lq)
    kp = np.arange(Lk)[None] if kp is None else np.asarray(kp).reshape(-1, Lk)
    delta = relative_distance(qp, kp)
    bias = inputs.get("bias")
    allowed = allowed_keys((B, H, Lq, Lk), delta, causal=spec.causal, mask=inputs.get("mask"), bias=bias)
    dead = None
    if spec.mask_fill is None:
        dead = dead_keys(allowed)
        key = np.where(dead[..., None], 0, key).astype(P.acc)
        value = np.where(dead[..., None], 0, value).astype(P.acc)

    q = _split(P.lin(query, p["wq"], p.get("bq")), H)
    k = _split(P.lin(key, p["wk"], p.get("bk")), H)
    v = _split(P.lin(value, p["wv"], p.get("bv")), H)
    s = spec.effective_scale
    s_rel = spec.relative_scale
    q_s = P.rnd(q * s) if order == 1 else q
    logits = P.mm(q_s, k.swapaxes(-1, -2))
    if order == 0:
        logits = P.rnd(logits * s)
    index = valid = None
    if spec.relative is not None:
        index, valid = _rel_index(spec, delta)
    if "rel_k" in p:
        q_r = P.rnd(q * s_rel) if order == 1 else q
        rows = P.mm(q_r, _table4(p["rel_k"]).swapaxes(-1, -2))
        term = gather_buckets(rows, index)
        if valid is not None:
            term = np.where(valid[:, None], term, 0)
        if order == 0:
            term = P.rnd(term * s_rel)
        logits = P.rnd(logits + term)
    if bias is not None:
        logits = P.rnd(logits + np.asarray(bias, P.acc))

    # softmax in acc (float32 for the 16-bit types)
    if spec.mask_fill is not None:
        z = np.where(allowed, logits, P.acc.type(spec.mask_fill))
        e = np.exp(z - z.max(-1, keepdims=True))
        w = e / P.rowsum(e)
    else:
        z = np.where(allowed, logits, -np.inf).astype(P.acc)
        m = z.max(-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.where(allowed, np.exp(z - m), 0)
        den = P.rowsum(e)
        w = np.where(den > 0, e / np.where(den > 0, den, 1), 0)
    w = P.rnd(w)
    keep = inputs.get("dropout_keep")
    wd = w if keep is None else P.rnd(np.where(keep, w / P.acc.type(1 - spec.dropout), 0))
    o = P.mm(wd, v)
    buckets = None
    if "rel_v" in p:
        buckets = P.rnd(scatter_buckets(wd, index, spec.relative.num_rows))
        o = P.rnd(o + P.mm(buckets, _table4(p["rel_v"])))
    merged = _merge(o)
    out = P.lin(merged, p["wo"], p.get("bo"))
    cache = dict(P=P, p=p, q=q, k=k, v=v, key=key, value=value, query=query, dead=dead, allowed=allowed,
                 w=w, wd=wd, keep=keep, index=index, valid=valid, buckets=buckets, merged=merged, bias=bias)
    return out, w, cache


def backward(spec: AttentionSpec, cache: dict, grad_out, order: int = 0) -> dict:
    """Gradients of <out, grad_out> by the same naive arithmetic (GRAD-1)."""
    c = cache
    P, p = c["P"], c["p"]
    H = spec.num_heads
    g = P.rnd(np.asarray(grad_out, np.float64))
    grads = {}

    def lin_vjp(x, w, gy):
        rows_x, rows_g = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
        db = P.rnd(P.rowsum(rows_g.T)[:, 0])  # summed over every (batch, position), in order
        return P.mm(gy, w.T), P.mm(rows_x.T, rows_g), db

    d_merged, grads["wo"], dbo = lin_vjp(c["merged"], p["wo"], g)
    d_o = _split(d_merged, H)
    d_wd = P.mm(d_o, c["v"].swapaxes(-1, -2))
    d_v = P.mm(c["wd"].swapaxes(-1, -2), d_o)
    if c["buckets"] is not None:
        rv = _table4(p["rel_v"])
        grads["rel_v"] = P.rnd(sum_to(c["buckets"].swapaxes(-1, -2) @ d_o, rv.shape)).reshape(p["rel_v"].shape)
        d_wd = P.rnd(d_wd + gather_buckets(P.mm(d_o, rv.swapaxes(-1, -2)), c["index"]))
    d_w = d_wd if c["keep"] is None else P.rnd(np.where(c["keep"], d_wd / P.acc.type(1 - spec.dropout), 0))
    w = c["w"]
    d_logits = P.rnd(np.where(c["allowed"], w * (d_w - P.rowsum(w * d_w)), 0))
    if c["bias"] is not None:
        grads["bias"] = P.rnd(sum_to(d_logits, np.shape(c["bias"])))
    s, s_rel = spec.effective_scale, spec.relative_scale
    d_scaled = P.rnd(d_logits * s)
    if order == 1:  # the query was scaled first: scale its gradient last
        d_q = P.rnd(P.mm(d_logits, c["k"]) * s)
    else:
        d_q = P.mm(d_scaled, c["k"])
    d_k = P.mm(d_scaled.swapaxes(-1, -2), c["q"])
    if "rel_k" in p:
        g_term = P.rnd(d_logits * s_rel)
        if c["valid"] is not None:
            g_term = np.where(c["valid"][:, None], g_term, 0)
        rk = _table4(p["rel_k"])
        g_rows = P.rnd(scatter_buckets(g_term, c["index"], rk.shape[-2]))
        d_q = P.rnd(d_q + P.mm(g_rows, rk))
        grads["rel_k"] = P.rnd(sum_to(g_rows.swapaxes(-1, -2) @ c["q"], rk.shape)).reshape(p["rel_k"].shape)
    for name, x, d_head in (("q", c["query"], d_q), ("k", c["key"], d_k), ("v", c["value"], d_v)):
        dx, grads["w" + name], db = lin_vjp(x, p["w" + name], _merge(d_head))
        if c["dead"] is not None and name != "q":
            dx = np.where(c["dead"][..., None], 0, dx)
        grads[{"q": "query", "k": "key", "v": "value"}[name]] = dx
        if spec.bias:
            grads["b" + name] = db
    if spec.bias:
        grads["bo"] = dbo
    return {n: np.asarray(a, np.float64) for n, a in grads.items()}
