"""The generic naive arithmetic: forward and backward in a given dtype (PREC-2, GRAD-1).

Axis legend: B batch, H heads, Lq query length, Lk key length, D model dim
(= H * d), d head dim, R table rows. Inputs are (B, L, D), heads (B, H, L, d),
logits and weights (B, H, Lq, Lk).

Full (B, H, Lq, Lk) arithmetic with gathers only, written independently of
``numpy_ref``'s forward and backward. A position scheme enters only through
its hooks (``schemes.base``), applied in ``spec.HOOKS`` order; this module
never names a scheme. Every rounding (``P.rnd``, ``P.mm``, ``P.lin``) is where
the stored budgets were made with it: moving one changes ``e_base``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from spec import AttentionSpec

from .keys import allowed_keys, dead_keys, positions, relative_distance
from .precision import Precision
from .schemes import hooks_for
from .tables import as_4d, gather, gather_keys, scatter_add, scatter_keys, sum_to


def _split(x, H):  # (B, L, D) -> (B, H, L, d)   HEAD-2
    B, L, D = x.shape
    return x.reshape(B, L, H, D // H).transpose(0, 2, 1, 3)


def _merge(x):  # (B, H, L, d) -> (B, L, D)   HEAD-2
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d)


def _kv_head(spec: AttentionSpec) -> np.ndarray:
    """HEAD-3: the key/value head of each query head, (H,) = floor(h * Hkv / H)."""
    return (np.arange(spec.num_heads) * spec.kv_heads) // spec.num_heads


def _kv_head_sum(spec: AttentionSpec, P: Precision, g):
    """The adjoint of reading key/value head ``_kv_head(h)``: (B, H, L, c) -> (B, Hkv, L, c), in order of h."""
    out = np.zeros((g.shape[0], spec.kv_heads) + g.shape[2:], P.acc)
    for h, kv in enumerate(_kv_head(spec)):  # a loop over heads, not positions
        out[:, kv] = P.rnd(out[:, kv] + g[:, h])
    return out


def _softmax(P: Precision, logits, allowed, mask_fill):
    """SOFTMAX-1 over keys in acc, with MASK-5 (mask_fill None: exact zeros) or MASK-6 (a float)."""
    if mask_fill is not None:
        z = np.where(allowed, logits, P.acc.type(mask_fill))
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / P.rowsum(e)
    z = np.where(allowed, logits, -np.inf).astype(P.acc)
    m = z.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a row with no allowed key
    e = np.where(allowed, np.exp(z - m), 0)
    den = P.rowsum(e)
    return np.where(den > 0, e / np.where(den > 0, den, 1), 0)


def forward(spec: AttentionSpec, params: dict, inputs: dict, dtype: str, order: int = 0):
    """(out (B, Lq, D), weights (B, H, Lq, Lk), cache) of the naive computation in ``dtype``.

    ``params`` and ``inputs`` hold float64 arrays whose values are already
    representable in ``dtype`` (the stored, rounded inputs); ``order`` is one
    of ``ORDERS``.
    """
    P = Precision(dtype, order)
    p = {n: np.asarray(a, P.acc) for n, a in params.items()}
    H = spec.num_heads
    query = np.asarray(inputs["query"], P.acc)
    key = np.asarray(inputs.get("key", inputs["query"]), P.acc)
    value = np.asarray(inputs.get("value", inputs.get("key", inputs["query"])), P.acc)
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    qp, kp = positions(inputs.get("q_positions"), Lq), positions(inputs.get("k_positions"), Lk)
    delta = relative_distance(qp, kp)  # (1|B, Lq, Lk)
    bias = inputs.get("bias")
    allowed = allowed_keys(
        (B, H, Lq, Lk), delta, causal=spec.causal, mask=inputs.get("mask"), bias=bias, window=spec.window
    )
    dead = None
    if spec.mask_fill is None:  # MASK-7: a dead key's values cannot leak, not even NaN
        dead = dead_keys(allowed)  # (B, Lk)
        key = np.where(dead[..., None], 0, key).astype(P.acc)
        value = np.where(dead[..., None], 0, value).astype(P.acc)
    scheme = spec.relative
    hooks = frozenset() if scheme is None else scheme.hooks
    impl = None if scheme is None else hooks_for(scheme)

    q = _split(P.lin(query, p["wq"], p.get("bq")), H)  # (B, H, Lq, d)
    kv = _kv_head(spec)  # HEAD-3
    k = _split(P.lin(key, p["wk"], p.get("bk")), spec.kv_heads)[:, kv]  # (B, H, Lk, d)
    v = _split(P.lin(value, p["wv"], p.get("bv")), spec.kv_heads)[:, kv]  # (B, H, Lk, dv), HEAD-4
    if "qk_transform" in hooks:
        q, k = impl.qk_transform(scheme, P, q, k, qp, kp)
    s, s_rel = spec.effective_scale, spec.relative_scale
    q_s = P.rnd(q * s) if order == 1 else q
    logits = P.mm(q_s, k.swapaxes(-1, -2))  # (B, H, Lq, Lk)
    if order == 0:
        logits = P.rnd(logits * s)
    terms = [np.abs(logits)]  # PREC-6: the magnitudes of the terms summed into each logit
    key_index = key_valid = value_index = value_valid = buckets = None
    if "key_term" in hooks:  # q_i . rel_k[row(b, i, j)], scaled by s_rel (SCALE-3)
        key_index, key_valid = impl.key_index(scheme, delta)  # (1|B, Lq, Lk)
        q_r = P.rnd(q * s_rel) if order == 1 else q
        rows = P.mm(q_r, as_4d(p["rel_k"]).swapaxes(-1, -2))  # (B, H, Lq, R)
        term = gather(rows, key_index)  # (B, H, Lq, Lk)
        if key_valid is not None:
            term = np.where(key_valid[:, None], term, 0)
        if order == 0:
            term = P.rnd(term * s_rel)
        logits = P.rnd(logits + term)
        terms.append(np.abs(term))
    side_table = side_index = None
    if "key_side_term" in hooks:  # k_j . table[row(b, i, j)], times s_side (SHAW-6, SHAW-7)
        side_table, side_index = impl.key_side_index(scheme, delta)
        s_side = spec.key_side_scale
        k_r = P.rnd(k * s_side) if order == 1 else k
        rows_k = P.mm(k_r, as_4d(p[side_table]).swapaxes(-1, -2))  # (B, H, Lk, R)
        term = gather_keys(rows_k, side_index)  # (B, H, Lq, Lk)
        if order == 0:
            term = P.rnd(term * s_side)
        logits = P.rnd(logits + term)
        terms.append(np.abs(term))
    capped = None
    if spec.softcap is not None:  # SOFTCAP-1: c * tanh(score / c), each step rounded
        c = P.acc.type(spec.softcap)
        capped = P.rnd(np.tanh(P.rnd(logits / c)))
        logits = P.rnd(capped * c)
        association = _association(terms)  # the sum the cap saw; the capped score is one term again
        terms = [association, np.abs(logits)] if association is not None else [np.abs(logits)]
    if "bias" in hooks:
        scheme_bias = impl.bias(scheme, P, p, H, qp, kp, delta)
        logits = P.rnd(logits + scheme_bias)
        terms.append(np.abs(scheme_bias))
    if bias is not None:  # BIAS-1: never scaled
        logits = P.rnd(logits + np.asarray(bias, P.acc))
        terms.append(np.abs(np.asarray(bias, P.acc)))

    w = P.rnd(_softmax(P, logits, allowed, spec.mask_fill))
    keep = inputs.get("dropout_keep")  # DROP-1
    wd = w if keep is None else P.rnd(np.where(keep, w / P.acc.type(1 - spec.dropout), 0))
    o = P.mm(wd, v)  # (B, H, Lq, d)
    if "value_term" in hooks:  # sum_j wd_ij rel_v[row(b, i, j)] as bucket sums @ rel_v
        value_index, value_valid = impl.value_index(scheme, delta)  # (1|B, Lq, Lk)
        rv = as_4d(p["rel_v"])
        wv = wd if value_valid is None else np.where(value_valid[:, None], wd, 0)
        buckets = P.rnd(scatter_add(wv, value_index, rv.shape[-2]))  # (B, H, Lq, R)
        o = P.rnd(o + P.mm(buckets, rv))
    merged = _merge(o)  # (B, Lq, H * dv)
    out = P.lin(merged, p["wo"], p.get("bo"))
    cache = dict(
        P=P,
        p=p,
        q=q,
        k=k,
        v=v,
        key=key,
        value=value,
        query=query,
        dead=dead,
        allowed=allowed,
        w=w,
        wd=wd,
        keep=keep,
        bias=bias,
        merged=merged,
        scheme=scheme,
        hooks=hooks,
        impl=impl,
        qp=qp,
        kp=kp,
        delta=delta,
        key_index=key_index,
        key_valid=key_valid,
        value_index=value_index,
        value_valid=value_valid,
        side_table=side_table,
        side_index=side_index,
        buckets=buckets,
        capped=capped,
        association=_association(terms),
        terms=terms,
    )
    return out, w, cache


def summands(spec: AttentionSpec, cache: dict, grad_out) -> dict:
    """PREC-6: the summand scale of every output by name ("out", "grad/wq", ...), max over its entries of
    sum |term| over the products that sum into it, two contractions deep (the output: every w_ij v_jc wo_co;
    a projection's gradient: every x_bl dS_bij k_bj; a table row: every pair's |dS| times its operand);
    ``cache`` from a float64 ``forward``. A rotation (ROPE) is taken as keeping magnitudes."""
    c, A = cache, np.abs
    heads = A(c["wd"]) @ A(c["v"])  # every w_ij v_j of the output's heads, (B, H, Lq, dv)
    if c["buckets"] is not None:
        heads = heads + A(c["buckets"]) @ A(as_4d(c["p"]["rel_v"]))
    scales = {"out": _largest(_merge(heads) @ A(c["p"]["wo"]), c["p"].get("bo"))}
    # a weight's relative error is that of exp(its logit) and of its denominator: every |q_c k_c| s and
    # |term| of its own logit, and of the row's logits weighed by their weights
    contents = (A(c["q"]) @ A(c["k"]).swapaxes(-1, -2)) * abs(spec.effective_scale)
    extra = sum(c["terms"][1:], np.zeros(()))
    logit_terms = np.where(c["allowed"], contents + extra, 0.0)
    w = A(c["w"])
    scales["weights"] = _largest(w * (logit_terms + (w * logit_terms).sum(-1, keepdims=True)))
    backward(spec, cache, grad_out, scales=scales)
    return scales


def logit_magnitude(cache: dict) -> float:
    """PREC-6: max over the allowed pairs of sum |term| of the logit terms another implementation may add in
    another association (content, relative terms, biases); 0 for a logit of one term. ``cache`` from
    ``forward``."""
    association = cache["association"]
    if association is None:
        return 0.0
    return float(np.max(np.broadcast_to(association, cache["allowed"].shape)[cache["allowed"]], initial=0.0))


def _association(terms: list):
    """The summed magnitudes of a logit's terms where it has more than one (a sum whose association varies)."""
    if len(terms) < 2:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _largest(a, extra=None) -> float:
    """max |a| (+ max |extra|, a bias added to every entry)."""
    top = float(np.max(np.abs(a), initial=0.0))
    return top + (0.0 if extra is None else float(np.max(np.abs(extra), initial=0.0)))


def _head_magnitudes(spec: AttentionSpec, c: dict, d_logits, d_o) -> dict:
    """PREC-6: the summed |products| of each head gradient entry, {"q", "k", "v"}: (B, H|Hkv, L, d|dv)."""
    A = np.abs
    pairs = A(d_logits) * abs(spec.effective_scale)  # every pair's |dS| times s
    m_q, m_k = pairs @ A(c["k"]), pairs.swapaxes(-1, -2) @ A(c["q"])
    m_v = A(c["wd"]).swapaxes(-1, -2) @ A(d_o)
    if c["key_index"] is not None:
        rows = scatter_add(A(d_logits) * abs(spec.relative_scale), c["key_index"], as_4d(c["p"]["rel_k"]).shape[-2])
        m_q = m_q + rows @ A(as_4d(c["p"]["rel_k"]))
    if c["side_index"] is not None:
        table = as_4d(c["p"][c["side_table"]])
        m_k = m_k + scatter_keys(A(d_logits) * abs(spec.key_side_scale), c["side_index"], table.shape[-2]) @ A(table)
    fold = np.zeros((m_k.shape[0], spec.kv_heads) + m_k.shape[2:])
    fold_v = np.zeros((m_v.shape[0], spec.kv_heads) + m_v.shape[2:])
    for h, kv in enumerate(_kv_head(spec)):  # HEAD-3: a loop over heads
        fold[:, kv] += m_k[:, h]
        fold_v[:, kv] += m_v[:, h]
    return {"q": m_q, "k": fold, "v": fold_v}


def backward(spec: AttentionSpec, cache: dict, grad_out, order: int = 0, scales: Optional[dict] = None) -> dict:
    """Gradients of <out, grad_out> by the same naive arithmetic (GRAD-1), float64 arrays by name.

    ``cache`` is what ``forward`` returned with the same ``order``; grad_out is (B, Lq, D). With ``scales``
    (a dict), also records there each gradient's summand scale under "grad/<name>" (PREC-6, ``summands``).
    """
    c = cache
    P, p, hooks, impl, scheme = c["P"], c["p"], c["hooks"], c["impl"], c["scheme"]
    H = spec.num_heads
    g = P.rnd(np.asarray(grad_out, np.float64))
    grads = {}
    A = np.abs

    def record(name, terms):  # the summand scale of grads[name]: the same reduction of |terms|
        if scales is not None:
            scales["grad/" + name] = max(scales.get("grad/" + name, 0.0), _largest(terms))

    def lin_vjp(x, w, gy, names, magnitude=None):  # (dx, dw, db) of y = x @ w + b
        rows_x, rows_g = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
        db = P.rnd(P.rowsum(rows_g.T)[:, 0])  # summed over every (batch, position), in order
        if scales is not None:  # ``magnitude``: the summed |products| of each entry of gy, else |gy|
            m = A(gy) if magnitude is None else magnitude
            rows_m = m.reshape(rows_g.shape)
            for name, terms in zip(names, (m @ A(w.T), A(rows_x.T) @ rows_m, rows_m.sum(0))):
                if name is not None:  # None: not an output (the merged heads)
                    record(name, terms)
        return P.mm(gy, w.T), P.mm(rows_x.T, rows_g), db

    d_merged, grads["wo"], dbo = lin_vjp(c["merged"], p["wo"], g, (None, "wo", "bo"))
    d_o = _split(d_merged, H)  # (B, H, Lq, d)
    d_wd = P.mm(d_o, c["v"].swapaxes(-1, -2))  # (B, H, Lq, Lk)
    d_v = P.mm(c["wd"].swapaxes(-1, -2), d_o)  # (B, H, Lk, d)
    if "value_term" in hooks:
        rv = as_4d(p["rel_v"])
        grads["rel_v"] = P.rnd(sum_to(c["buckets"].swapaxes(-1, -2) @ d_o, rv.shape)).reshape(p["rel_v"].shape)
        record("rel_v", sum_to(A(c["buckets"]).swapaxes(-1, -2) @ A(d_o), rv.shape))
        d_value = gather(P.mm(d_o, rv.swapaxes(-1, -2)), c["value_index"])
        if c["value_valid"] is not None:
            d_value = np.where(c["value_valid"][:, None], d_value, 0)
        d_wd = P.rnd(d_wd + d_value)
    d_w = d_wd if c["keep"] is None else P.rnd(np.where(c["keep"], d_wd / P.acc.type(1 - spec.dropout), 0))
    w = c["w"]
    d_logits = P.rnd(np.where(c["allowed"], w * (d_w - P.rowsum(w * d_w)), 0))  # GRAD-2
    if c["bias"] is not None:
        grads["bias"] = P.rnd(sum_to(d_logits, np.shape(c["bias"])))
        record("bias", sum_to(A(d_logits), np.shape(c["bias"])))
    if "bias" in hooks:
        grads.update(impl.bias_vjp(scheme, P, p, spec.num_heads, c["qp"], c["kp"], c["delta"], d_logits))
        if scales is not None:  # a table read's adjoint: the same scatter of |d logits|
            magnitudes = impl.bias_vjp(scheme, P, p, spec.num_heads, c["qp"], c["kp"], c["delta"], A(d_logits))
            for name, t in magnitudes.items():
                record(name, t)
    if c["capped"] is not None:  # SOFTCAP-1: d score = d capped * (1 - tanh^2)
        d_logits = P.rnd(d_logits * P.rnd(1 - P.rnd(c["capped"] * c["capped"])))
    s, s_rel = spec.effective_scale, spec.relative_scale
    d_scaled = P.rnd(d_logits * s)
    if order == 1:  # the query was scaled first: scale its gradient last
        d_q = P.rnd(P.mm(d_logits, c["k"]) * s)
    else:
        d_q = P.mm(d_scaled, c["k"])
    d_k = P.mm(d_scaled.swapaxes(-1, -2), c["q"])
    if "key_term" in hooks:
        g_term = P.rnd(d_logits * s_rel)
        if c["key_valid"] is not None:
            g_term = np.where(c["key_valid"][:, None], g_term, 0)
        rk = as_4d(p["rel_k"])
        g_rows = P.rnd(scatter_add(g_term, c["key_index"], rk.shape[-2]))  # (B, H, Lq, R)
        d_q = P.rnd(d_q + P.mm(g_rows, rk))
        grads["rel_k"] = P.rnd(sum_to(g_rows.swapaxes(-1, -2) @ c["q"], rk.shape)).reshape(p["rel_k"].shape)
        if scales is not None:  # every (pair, channel) product summed into a row
            abs_rows = scatter_add(A(g_term), c["key_index"], rk.shape[-2])
            record("rel_k", sum_to(abs_rows.swapaxes(-1, -2) @ A(c["q"]), rk.shape))
    if "key_side_term" in hooks:
        table = as_4d(p[c["side_table"]])
        g_rows = P.rnd(scatter_keys(P.rnd(d_logits * spec.key_side_scale), c["side_index"], table.shape[-2]))
        d_k = P.rnd(d_k + P.mm(g_rows, table))  # (B, H, Lk, d)
        d_table = P.rnd(sum_to(g_rows.swapaxes(-1, -2) @ c["k"], table.shape)).reshape(p[c["side_table"]].shape)
        grads[c["side_table"]] = P.rnd(grads[c["side_table"]] + d_table) if c["side_table"] in grads else d_table
        if scales is not None:
            abs_rows = scatter_keys(A(d_logits * spec.key_side_scale), c["side_index"], table.shape[-2])
            record(c["side_table"], sum_to(abs_rows.swapaxes(-1, -2) @ A(c["k"]), table.shape))
    if "qk_transform" in hooks:
        d_q, d_k = impl.qk_transform_vjp(scheme, P, d_q, d_k, c["qp"], c["kp"])
    d_k, d_v = _kv_head_sum(spec, P, d_k), _kv_head_sum(spec, P, d_v)  # HEAD-3
    magnitudes = {} if scales is None else _head_magnitudes(spec, c, d_logits, d_o)
    for name, x, d_head in (("q", c["query"], d_q), ("k", c["key"], d_k), ("v", c["value"], d_v)):
        names = ({"q": "query", "k": "key", "v": "value"}[name], "w" + name, "b" + name)
        m = magnitudes.get(name)
        dx, grads["w" + name], db = lin_vjp(x, p["w" + name], _merge(d_head), names, None if m is None else _merge(m))
        if c["dead"] is not None and name != "q":  # MASK-7: a dead key gets no gradient
            dx = np.where(c["dead"][..., None], 0, dx)
        grads[{"q": "query", "k": "key", "v": "value"}[name]] = dx
        if spec.bias:
            grads["b" + name] = db
    if spec.bias:
        grads["bo"] = dbo
    return {n: np.asarray(a, np.float64) for n, a in grads.items()}
