"""A literal, loop-level transcription of the rules: for tiny sizes only.

Every quantity is computed element by element, with explicit loops over
batch, head, query and key, straight from the formulas of the spec text. It
shares no numerical code with the vectorised reference (only the argument
checks), and exists to test it. Complexity is O(B H Lq Lk d) interpreter
steps: keep sizes in the tens. A position scheme enters through the literal
forms of its hooks (``numpy_ref.schemes``, REL-3), applied in the order of
REL-3; nothing here names a scheme.
"""

from __future__ import annotations

import math

import numpy as np

from spec import AttentionSpec

from . import schemes
from ._inputs import prepare


def _dot(a, b) -> float:
    return math.fsum(float(x) * float(y) for x, y in zip(a, b))


def attention(
    spec: AttentionSpec,
    params: dict,
    query,
    key=None,
    value=None,
    *,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
    return_weights: bool = False,
):
    """Same contract as ``numpy_ref.attention``, computed by loops; the scheme through its literal hooks (REL-3)."""
    call = prepare(
        spec,
        params,
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
    )
    hooks = schemes.bind(spec.relative, literal=True)
    p = call.params
    B, Lq, Lk = call.dims
    H, d, D = spec.num_heads, spec.head_dim, spec.model_dim
    Hkv = H if spec.num_kv_heads is None else spec.num_kv_heads  # HEAD-3
    dv = d if spec.value_head_dim is None else spec.value_head_dim  # HEAD-4
    s = spec.scale if spec.scale is not None else 1.0 / math.sqrt(d)  # SCALE-1: d, not dv
    s_rel = s if spec.scale_relative else 1.0  # SCALE-3
    s_side = s_rel if getattr(spec.relative, "key_side_scaled", True) else 1.0  # SHAW-7
    left, right = (None, None) if spec.window is None else spec.window  # WINDOW-1
    zeros = np.zeros(max(D, H * dv))
    bq, bk, bv, bo = (p.get(n, zeros) for n in ("bq", "bk", "bv", "bo"))
    full = (B, H, Lq, Lk)
    mask_b = None if call.mask is None else np.broadcast_to(call.mask, full)
    bias_b = None if call.bias is None else np.broadcast_to(call.bias, full)
    qpos = np.broadcast_to(call.q_positions, (B, Lq))
    kpos = np.broadcast_to(call.k_positions, (B, Lk))

    def proj(x, w, b, t, f):  # PROJ-1: (x @ W + b)[t, f]
        return math.fsum(float(x[t, e]) * float(w[e, f]) for e in range(D)) + float(b[f])

    out = np.zeros((B, Lq, D))
    weights = np.zeros(full)
    for b in range(B):
        # q, k, v per head, HEAD-1: feature f = h * d + c
        Q = [[[proj(call.query[b], p["wq"], bq, i, h * d + c) for c in range(d)] for i in range(Lq)] for h in range(H)]
        # key/value head g = h * Hkv // H serves query head h (HEAD-3); value heads have dv channels (HEAD-4)
        K = [[[proj(call.key[b], p["wk"], bk, j, g * d + c) for c in range(d)] for j in range(Lk)] for g in range(Hkv)]
        V = [
            [[proj(call.value[b], p["wv"], bv, j, g * dv + c) for c in range(dv)] for j in range(Lk)]
            for g in range(Hkv)
        ]
        K = [K[h * Hkv // H] for h in range(H)]
        V = [V[h * Hkv // H] for h in range(H)]
        if hooks.uses("qk_transform"):  # REL-3 (1): each q and k vector at its own position
            Q = [[hooks.call("literal_q", p, h, Q[h][i], int(qpos[b, i])) for i in range(Lq)] for h in range(H)]
            K = [[hooks.call("literal_k", p, h, K[h][j], int(kpos[b, j])) for j in range(Lk)] for h in range(H)]
        merged = np.zeros((Lq, H * dv))
        for h in range(H):
            for i in range(Lq):
                logit, allowed = [0.0] * Lk, [True] * Lk
                for j in range(Lk):
                    qp, kp = int(qpos[b, i]), int(kpos[b, j])
                    delta = kp - qp  # POS-2
                    term = s * _dot(Q[h][i], K[h][j])  # SCALE-2
                    if hooks.uses("key_term"):  # REL-3 (2), REL-1, SCALE-3
                        term += s_rel * hooks.call("literal_key_term", p, h, Q[h][i], qp, kp)
                    if hooks.uses("key_side_term"):  # REL-3 (2b), SHAW-6, SHAW-7
                        term += s_side * hooks.call("literal_key_side_term", p, h, K[h][j], qp, kp)
                    if spec.softcap is not None:  # SOFTCAP-1: before biases and masks
                        term = spec.softcap * math.tanh(term / spec.softcap)
                    if hooks.uses("bias"):  # REL-3 (3): unscaled
                        term += hooks.call("literal_bias", p, h, H, qp, kp)
                    if bias_b is not None:  # BIAS-1
                        term += float(bias_b[b, h, i, j])
                        allowed[j] = bias_b[b, h, i, j] != -math.inf  # BIAS-2
                    if spec.causal and delta > 0:  # CAUSAL-1
                        allowed[j] = False
                    if (left is not None and delta < -left) or (right is not None and delta > right):  # WINDOW-1
                        allowed[j] = False
                    if mask_b is not None and not mask_b[b, h, i, j]:  # MASK-1/2
                        allowed[j] = False
                    logit[j] = term
                # SOFTMAX-1 with MASK-5 / MASK-6
                if spec.mask_fill is not None:
                    z = [logit[j] if allowed[j] else spec.mask_fill for j in range(Lk)]
                    live = list(range(Lk))
                else:
                    z = logit
                    live = [j for j in range(Lk) if allowed[j]]
                w = [0.0] * Lk
                if live:
                    m = max(z[j] for j in live)
                    e = {j: math.exp(z[j] - m) for j in live}
                    total = math.fsum(e.values())
                    for j in live:
                        w[j] = e[j] / total
                for j in range(Lk):
                    weights[b, h, i, j] = w[j]
                    if call.dropout_keep is not None:  # DROP-1
                        w[j] = w[j] / (1.0 - spec.dropout) if call.dropout_keep[b, h, i, j] else 0.0
                # o_i = sum_j w'_ij (v_j + value_row_ij) over the keys that take part (REL-1)
                keys = live if spec.mask_fill is None else range(Lk)
                rows = {}
                if hooks.uses("value_term"):  # REL-3 (4): with the weights after dropout (DROP-4)
                    rows = {j: hooks.call("literal_value_row", p, h, int(qpos[b, i]), int(kpos[b, j])) for j in keys}
                for c in range(dv):
                    acc = []
                    for j in keys:
                        acc.append(w[j] * V[h][j][c])
                        if j in rows:
                            acc.append(w[j] * float(rows[j][c]))
                    merged[i, h * dv + c] = math.fsum(acc)  # HEAD-2
        for i in range(Lq):  # OUT-1
            for f in range(D):
                out[b, i, f] = math.fsum(merged[i, e] * float(p["wo"][e, f]) for e in range(H * dv)) + float(bo[f])
    return (out, weights) if return_weights else out
