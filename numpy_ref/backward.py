"""The analytic backward pass (vector-Jacobian product), float64.

Derived by hand from ``forward.run``, step by step in reverse; every step
names the forward rule it differentiates. A position scheme's terms are
differentiated by its own hooks' VJPs (REL-3, ``numpy_ref.schemes``).
Rules GRAD-1..GRAD-3.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from spec import AttentionSpec
from spec.validation import fail_type, fail_value

from . import relative as rel
from ._inputs import describe, prepare
from .forward import Trace, run
from .heads import merge_heads, split_heads, sum_kv_heads
from .masking import masked_softmax_vjp, softcap_vjp


def _project_vjp(x: np.ndarray, w: np.ndarray, g: np.ndarray):
    """y = x @ W + b  ->  (dx, dW, db)."""
    return g @ w.T, np.einsum("bli,blo->io", x, g), g.sum(axis=(0, 1))


def _add_grads(grads: dict, more: dict) -> None:
    """Accumulate a hook's table gradients (two hooks may share a table)."""
    for name, g in more.items():
        grads[name] = grads[name] + g if name in grads else g


def backward(spec: AttentionSpec, trace: Trace, grad_out: np.ndarray) -> dict:
    """The VJP of ``forward.run`` (GRAD-1, GRAD-2): every input and parameter gradient by name.

    The scheme's hooks are differentiated in the reverse of the REL-3 order:
    value term, bias, key-side term, key term, q/k transform.
    """
    # OUT-1: out = merged @ wo + bo
    d_merged, d_wo, d_bo = _project_vjp(trace.merged, trace.call.params["wo"], grad_out)
    grads = backward_heads(spec, trace, split_heads(d_merged, spec.num_heads))  # HEAD-2 inverse
    grads["wo"] = d_wo
    if spec.bias:
        grads["bo"] = d_bo
    return grads


def backward_heads(spec: AttentionSpec, trace: Trace, d_o: np.ndarray, rows: Optional[np.ndarray] = None) -> dict:
    """GRAD-1: the VJP of ``forward.run`` from the gradient of each head's output ``d_o`` (B, H, Lq, dv) back, OUT-1
    excluded: every input gradient and every parameter's but wo's and bo's. A dead key's row (MASK-7) enters the
    projections' VJP as the zeros the forward pass put there, and its input gradient is 0.

    ``rows`` (B, H, Lq), when given, stands for each row's sum_j w_ij dL/dw_ij in the softmax's VJP: a block of
    keys differentiated alone takes the whole row's sum there (BLOCK-6); by default the trace's own.
    """
    call = trace.call
    p = call.params
    hooks, saved = trace.hooks, trace.saved
    grads: dict = {}
    d_weights, d_v = _weights_vjp(spec, trace, d_o, grads)

    # SOFTMAX-1 with MASK-5/6: constants at disallowed keys (GRAD-2)
    d_logits = masked_softmax_vjp(trace.weights, trace.allowed, d_weights, rows)

    # BIAS-1: added unscaled; REL-3 (3): so is the scheme's bias
    if call.bias is not None:
        grads["bias"] = rel.sum_to(d_logits, call.bias.shape)
    if hooks.uses("bias"):
        _add_grads(grads, hooks.call("bias_vjp", p, saved["bias"], d_logits))

    # SOFTCAP-1: the score went through cap * tanh(score / cap)
    if trace.capped is not None:
        d_logits = softcap_vjp(trace.capped, d_logits)

    # SCALE-2: s * q @ k.T
    s = spec.effective_scale
    d_q = s * (d_logits @ trace.k)
    d_k = s * (d_logits.swapaxes(-1, -2) @ trace.q)
    if hooks.uses("key_term"):  # REL-3 (2), SCALE-3
        dq_term, g = hooks.call("key_term_vjp", p, saved["key_term"], spec.relative_scale * d_logits)
        _add_grads(grads, g)
        d_q = d_q + dq_term
    if hooks.uses("key_side_term"):  # REL-3 (2b), SHAW-7
        dk_term, g = hooks.call("key_side_term_vjp", p, saved["key_side_term"], spec.key_side_scale * d_logits)
        _add_grads(grads, g)
        d_k = d_k + dk_term
    if hooks.uses("qk_transform"):  # REL-3 (1): back to the q, k of the head split
        d_q, d_k, g = hooks.call("qk_transform_vjp", p, saved["qk_transform"], d_q, d_k)
        _add_grads(grads, g)

    # HEAD-3: a key/value head's gradient sums over the query heads of its group
    d_k, d_v = sum_kv_heads(d_k, spec.group_size), sum_kv_heads(d_v, spec.group_size)

    # PROJ-1 and HEAD-1 for q, k, v
    for name, x, d_head in (("q", call.query, d_q), ("k", None, d_k), ("v", None, d_v)):
        if x is None:
            x = call.key if name == "k" else call.value
            if trace.dead is not None:  # MASK-7: the dead rows were replaced by zeros
                x = np.where(trace.dead[..., None], 0.0, x)
        dx, grads["w" + name], db = _project_vjp(x, p["w" + name], merge_heads(d_head))
        if trace.dead is not None and name != "q":
            dx = np.where(trace.dead[..., None], 0.0, dx)
        grads[{"q": "query", "k": "key", "v": "value"}[name]] = dx
        if spec.bias:
            grads["b" + name] = db
    return grads


def _weights_vjp(spec: AttentionSpec, trace: Trace, d_o: np.ndarray, grads: dict) -> tuple:
    """(dL/dw (B, H, Lq, Lk) of the weights before dropout, dL/dv (B, H, Lk, dv)) from each head's output
    gradient; the value term's table gradients added to ``grads``."""
    call, hooks = trace.call, trace.hooks
    # o = w' @ v  (+ REL-3 (4): the value term of w')
    d_dropped = d_o @ trace.v.swapaxes(-1, -2)  # (B, H, Lq, Lk)
    d_v = trace.dropped.swapaxes(-1, -2) @ d_o  # (B, H, Lk, dv)
    if hooks.uses("value_term"):
        d_w, g = hooks.call("value_term_vjp", call.params, trace.saved["value_term"], d_o)
        _add_grads(grads, g)
        d_dropped = d_dropped + d_w
    # DROP-1: w' = w * keep / (1 - p)
    if call.dropout_keep is not None:
        return np.where(call.dropout_keep, d_dropped / (1.0 - spec.dropout), 0.0), d_v
    return d_dropped, d_v


def weight_row_sums(spec: AttentionSpec, trace: Trace, d_o: np.ndarray) -> np.ndarray:
    """sum_j w_ij dL/dw_ij (B, H, Lq) of a trace's weights, from each head's output gradient (BLOCK-6)."""
    d_weights, _ = _weights_vjp(spec, trace, d_o, {})
    return (trace.weights * d_weights).sum(axis=-1)


def attention_vjp(
    spec: AttentionSpec,
    params: dict,
    query,
    key,
    value,
    grad_out,
    *,
    mask=None,
    bias=None,
    q_positions=None,
    k_positions=None,
    dropout_keep=None,
) -> dict:
    """Gradients of <attention(...), grad_out> in float64 (GRAD-1).

    Same arguments as ``attention``; ``key`` and ``value`` are required
    arrays (for self-attention pass the same array three times and add the
    three input gradients). ``grad_out`` is [B, Lq, D].

    Returns a dict with "query", "key", "value", "bias" (when a bias was
    given, in the bias's own shape: broadcast axes summed) and one entry per
    canonical parameter name. Masks, positions and keep masks have no
    gradient (GRAD-3).
    """
    call, g = prepare_vjp(
        "attention_vjp",
        spec,
        params,
        query,
        key,
        value,
        grad_out,
        mask=mask,
        bias=bias,
        q_positions=q_positions,
        k_positions=k_positions,
        dropout_keep=dropout_keep,
    )
    return in_order(spec, backward(spec, run(spec, call), g), bias is not None)


def in_order(spec: AttentionSpec, grads: dict, with_bias: bool) -> dict:
    """The gradients by name in the order of ``attention_vjp``'s result."""
    order = ["query", "key", "value"] + (["bias"] if with_bias else []) + list(spec.param_shapes())
    return {name: grads[name] for name in order}


def prepare_vjp(function: str, spec: AttentionSpec, params: dict, query, key, value, grad_out, **inputs):
    """The checked call of a VJP (``attention``'s checks, key and value required) and grad_out in float64."""
    for name, x in (("key", key), ("value", value)):
        if x is None:
            raise fail_value(
                name,
                f"an array ({function} has no self-attention default; pass the query again and add the gradients)",
                "None",
            )
    call = prepare(spec, params, query, key, value, **inputs)
    g = describe(grad_out)
    expected = (call.dims.B, call.dims.Lq, spec.model_dim)
    if g is None or g.kind != "float":
        raise fail_type("grad_out", "a floating-point array", "None" if g is None else f"dtype {g.dtype}")
    if g.shape != expected:
        raise fail_value("grad_out", f"shape (B, Lq, D) = {expected}", g.shape)
    return call, np.asarray(grad_out).astype(np.float64)
