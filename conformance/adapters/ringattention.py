"""``ringattention``: the JAX ring of the ``ringattention`` package (0.1.2, ``ringattention_jax.ring_attention``,
the Ring Attention paper's code) on 2, 4 or 8 of 8 host devices, judged against the same goldens and budgets.

What is certified is the library's ring: inside ``jax.shard_map`` over one mesh axis each device holds L / n
queries, keys and values in order (its only layout), the key/value blocks travel by ``lax.ppermute``, each block
is folded into a running maximum, numerator and denominator, and the backward is a second ring that takes each
row's sum as ``g . output`` (BLOCK-6's form). Its interface is what people use: q, k, v as (B, L, H, d), one
additive ``attn_bias`` (B|1, H|1, rows of the shard, every key) whose columns it slices at the block's global key
offset, causality by ``causal_block_size`` (1: token by token) on global token indices, the logits divided by
sqrt(d). The adapter does what a user does around it: attnspec's projections (PROJ-1) and q/k transform (RoPE,
REL-3 (1)) at the global positions, the key/value heads repeated to H (HEAD-4), the query scaled by
``scale * sqrt(d)`` for another scale (SCALE-2), and the position bias (ALiBi, T5, Swin: REL-3 (3)), the bias
input (BIAS-1) and every mask but causality (the mask, the window, padding; MASK-4) in ``attn_bias``, the
disallowed pairs at ``finfo(dtype).min``, as its own segment mask does. 16-bit inputs take ``float32_logits``
(PREC-4).

The package's ``__init__`` does not import on jax 0.10 (it reads ``jax.lib.xla_bridge``, which jax removed), so the
adapter loads ``ringattention_jax.py`` from the installed package by its path; nothing in that file needs the
removed name. What the ring departs from is in ``conformance/deviations.json`` (``ringattention-*``) and measured
by tests/test_ringattention.py: causality merged into the bias by ``jnp.minimum`` (a positive bias on an allowed
pair becomes 0), causality on token indices rather than positions, the key block of a query's own token skipped
where a query chunk is one token (``below_or_on_diag`` asks ``>`` for ``>=``), the mean of the values for a fully
masked row (MASK-5), NaN from a dead key (MASK-7), no gradient for the bias, and with ``float32_logits`` (16-bit)
gradients in float32 that make the transpose of any operation before the ring raise. Each query chunk reads the
bias's rows from 0 (``_chunk_attention_bias``), so the adapter makes one query chunk per shard.

Lengths are padded to a multiple of n as ``jax:ring`` pads them (extra keys masked in the bias, extra rows
dropped); the shards of queries and keys may differ in length (cross-attention), the library's causal rule then
compares global token indices, as the spec's does with default positions. The ring runs in a process of its
own with 8 host devices, fed over a pipe.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax
from .base import FEATURES, Capabilities
from .ring import DIFF, JaxRingAdapter, bias_padding, pad_inputs, padded_lengths, serve_on_host_devices

#: The pinned release.
VERSION = "0.1.2"
#: What ``ringattention.ring_attention``'s interface cannot be asked for.
MISSING = {
    "shaw": "one additive bias is the only position input; a key term q . a_(j-i) (SHAW-2) is not one",
    "shaw-values": "the output is the weighted values alone; no value term (SHAW-4)",
    "shaw-key-side": "one additive bias is the only position input (SHAW-6)",
    "huang": "one additive bias is the only position input; Huang's key term depends on the query (HUANG-2)",
    "huang-values": "the output is the weighted values alone; no value term (HUANG-3)",
    "per-head-tables": "Shaw and Huang tables only (see shaw, huang)",
    "unscaled-relative": "Shaw and Huang key terms only (see shaw, huang)",
    "softcap": "the logits go to the softmax as they are; no cap (SOFTCAP-1)",
    "mask-fill": "disallowed pairs get finfo(dtype).min added, never a fill value (MASK-6)",
    "value-head-dim": "its numerator is allocated with the query's head dim; a value head dim of its own fails",
    "dropout-spec": "its dropout draws its own mask (attn_pdrop, dropout_rng); no keep mask to compare",
    "dropout-keep": "it takes no keep mask (DROP-1)",
    "validates-input": "the harness shards a call before ringattention sees it; it checks no argument",
}


#: Input dtypes that take ``float32_logits`` (PREC-4).
SIXTEEN = ("bfloat16", "float16")


def load():
    """``ringattention_jax``, from the installed package's folder (its ``__init__`` fails on jax 0.10)."""
    import importlib.util
    import pathlib
    import sys

    if "ringattention_jax" in sys.modules:
        return sys.modules["ringattention_jax"]
    found = importlib.util.find_spec("ringattention")
    if found is None or not found.submodule_search_locations:
        raise ImportError(f"ringattention is not installed; pip install ringattention=={VERSION} einops")
    path = pathlib.Path(found.submodule_search_locations[0]) / "ringattention_jax.py"
    spec = importlib.util.spec_from_file_location("ringattention_jax", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["ringattention_jax"] = module
    return module


class RingAttentionAdapter(JaxRingAdapter):
    """``jax:ring``'s machinery (a process of 8 host devices fed over a pipe, the shard count by a hash of the
    call) around ringattention's ring."""

    name = "ringattention"
    description = (
        f"ringattention {VERSION}'s JAX ring (ringattention_jax.ring_attention) under shard_map on 2, 4 or 8 of 8 "
        "host devices, contiguous shards, one additive bias, causal_block_size=1; gradients by its custom VJP"
    )

    def unavailable(self):
        missing = _jax.jax_available()
        if missing:
            return missing
        import importlib.util

        if importlib.util.find_spec("ringattention") is None or importlib.util.find_spec("einops") is None:
            return f"ringattention is not installed; pip install attnspec[ringattention] (ringattention=={VERSION})"
        return None

    def capabilities(self):
        return Capabilities(
            devices=("cpu",),
            features=FEATURES - set(MISSING),
            weights=False,
            notes=dict(MISSING),
            unsupported=dict(_jax.UNSUPPORTED),
        )

    @staticmethod
    def worker(conn, rank, count, address):
        serve_on_host_devices(conn, _handle)


def _handle(kind, spec, params, inputs, grad_out, n):
    import importlib.metadata

    import jax

    from .jax_impl_adapter import omitted_inputs

    if kind == "environment":
        return {
            **_jax.setup(),
            "ringattention": importlib.metadata.version("ringattention"),
            "host_devices": len(jax.devices("cpu")),
        }
    x = inputs["query"]
    precision = _jax.matmul_precision(x.dtype.name)
    lengths_ = padded_lengths(spec, inputs, n, "contiguous")
    other = pad_inputs(spec, inputs, n, "contiguous")
    if kind in ("forward", "forward_only") and x.dtype.name in SIXTEEN:
        # its gradients raise in 16-bit (ringattention-float32-logits-gradient-dtype): the forward alone
        called = {k: inputs[k] for k in DIFF if k in inputs}
        return {"out": np.asarray(_program(spec, n, precision, x.dtype.name, lengths_, None)(params, called, other))}
    # the forward and the gradients of a case are one program, run for each of the two calls
    omitted, full = omitted_inputs(inputs)
    called = {k: full[k] for k in DIFF if k in full and k not in omitted}
    g = np.zeros(x.shape, x.dtype) if grad_out is None else grad_out
    out, (g_params, g_inputs) = _program(spec, n, precision, x.dtype.name, lengths_, omitted)(params, called, other, g)
    if kind in ("forward", "forward_only"):
        return {"out": np.asarray(out)}
    return {k: np.asarray(a) for k, a in {**g_params, **g_inputs}.items()}


@functools.lru_cache(maxsize=64)
def _program(spec, n, precision, dtype_name, lengths_, omitted):
    """The padded call through ringattention's ring, jitted: ``out = f(params, called, other)`` with ``omitted``
    None; else ``(out, grads) = f(params, called, other, g)``."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from jax_impl import schemes
    from jax_impl.heads import merge, project, split
    from jax_impl.masking import allowed_keys, as4d, distance, stat_dtype

    from .jax_impl_adapter import _explicit

    ring = load()
    Lq, Lk, Lq2, Lk2 = lengths_
    mesh = Mesh(np.array(jax.devices("cpu")[:n]), ("seq",))
    hooks = schemes.plain_hooks(spec.relative)
    not_causal = dataclasses.replace(spec, causal=False)  # causality is the library's (causal_block_size)
    H, Hkv = spec.num_heads, spec.kv_heads
    d = spec.head_dim
    sixteen = dtype_name in SIXTEEN
    kwargs = dict(
        causal_block_size=1 if spec.causal else None,
        query_chunk_size=Lq2 // n,  # one chunk per shard: the bias's rows are sliced from 0 (see the tests)
        key_chunk_size=Lk2 // n,
        deterministic=True,
        dropout_rng=None,
        attn_pdrop=0.0,
        dtype=jnp.float32 if sixteen else jnp.dtype(dtype_name),  # PREC-4: the logits' dtype
        policy=jax.checkpoint_policies.nothing_saveable,
        precision=jax.lax.Precision.HIGHEST if precision == "highest" else None,
        prevent_cse=True,
    )

    def sharded(q, k, v, bias):
        return ring.ring_attention(q, k, v, bias, None, None, "seq", sixteen, kwargs)

    def call(params, diff, other):
        def rows(a, L2):
            return None if a is None else jnp.pad(a, ((0, 0), (0, L2 - a.shape[1]), (0, 0)))

        query = rows(diff["query"], Lq2)
        key = query if diff.get("key") is None else rows(diff["key"], Lk2)
        value = key if diff.get("value") is None else rows(diff["value"], Lk2)
        p = params
        q = split(project(query, p["wq"], p.get("bq")), H)  # (B, H, Lq2, d)
        k = split(project(key, p["wk"], p.get("bk")), Hkv)
        v = split(project(value, p["wv"], p.get("bv")), Hkv)
        q_pos = jnp.asarray(other["q_positions"]).reshape(-1, Lq2)  # POS-1: (1|B, L), global
        k_pos = jnp.asarray(other["k_positions"]).reshape(-1, Lk2)
        if hooks.qk_transform is not None:  # REL-3 (1): at the global positions
            q, k = hooks.qk_transform(p, q, k, q_pos, k_pos)
        if Hkv != H:  # HEAD-4: the library takes H key/value heads
            k, v = jnp.repeat(k, H // Hkv, axis=1), jnp.repeat(v, H // Hkv, axis=1)
        q = q * jnp.asarray(spec.effective_scale * np.sqrt(d), q.dtype)  # SCALE-2: it divides by sqrt(d)
        stat = stat_dtype(q.dtype)
        delta = distance(q_pos, k_pos)
        bias = diff.get("bias")
        if bias is not None:
            bias = jnp.pad(as4d(bias), bias_padding(bias.shape, Lq, Lk, Lq2, Lk2)).astype(stat)
        mask = other.get("mask")
        allowed = allowed_keys(not_causal, delta, None if mask is None else jnp.asarray(mask), bias)  # MASK-4
        terms = None
        if hooks.bias is not None:  # REL-3 (3)
            terms = hooks.bias(p, q_pos, k_pos, delta, num_heads=H, dtype=stat).astype(stat)
        if bias is not None:  # BIAS-1
            terms = bias if terms is None else terms + bias
        if allowed is not None:
            terms = jnp.zeros((1, 1, 1, 1), stat) if terms is None else terms
            terms = jnp.where(allowed, terms, jnp.finfo(stat).min)
        if terms is not None:
            terms = jnp.broadcast_to(terms, terms.shape[:2] + (Lq2, Lk2))
        token = P(None, "seq", None, None)
        qkv = [jnp.swapaxes(a, 1, 2) for a in (q, k, v)]  # (B, L, H, d): the library's layout
        if terms is None:
            o = jax.shard_map(
                lambda q, k, v: sharded(q, k, v, None), mesh=mesh, in_specs=(token,) * 3, out_specs=token,
                check_vma=False,
            )(*qkv)  # fmt: skip
        else:
            o = jax.shard_map(
                sharded, mesh=mesh, in_specs=(token,) * 3 + (P(None, None, "seq", None),), out_specs=token,
                check_vma=False,
            )(*qkv, terms)  # fmt: skip
        out = project(merge(jnp.swapaxes(o, 1, 2)), p["wo"], p.get("bo"))  # OUT-1
        return out[:, :Lq]

    def both(params, called, other, g):
        with jax.default_matmul_precision(precision):
            out, pullback = jax.vjp(lambda p, dd: call(p, dd, other), params, _explicit(called, omitted))
            return (call(params, called, other) if omitted else out), pullback(g)

    def forward(params, called, other):
        with jax.default_matmul_precision(precision):
            return call(params, called, other)

    return jax.jit(forward if omitted is None else both)
