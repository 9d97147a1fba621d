"""tensor2tensor's relative attention (the Shaw et al. and Music Transformer authors' code), run as its authors ran it.

Three functions of ``tensor2tensor.layers.common_attention`` (1.15.7), each
called in a TensorFlow graph (``tf.compat.v1``) as ``multihead_attention``
calls it, with q, k, v made by the canonical projections and t2t's own
``split_heads`` / ``combine_heads`` (PROJ-1, HEAD-1, OUT-1):

- ``dot_product_attention_relative`` (``t2t-shaw``): Shaw's keys and values
  (SHAW-1..3), one key table and one value table for every head, index
  ``clip(k_pos - q_pos, -k, k) + k``, the same rows as the spec's (POS-2):
  ``rel_k``, ``rel_v`` load as they are (a case without a value term loads
  zeros into the value table, which adds exactly nothing);
- ``dot_product_self_attention_relative_v2`` (``t2t-huang``, causal): a
  table of ``M`` rows for distances ``-(M-1) .. 0``, which are the rows
  ``0 .. M-1`` of the spec's ``Huang(M)`` table (HUANG-1); the causal rule
  is t2t's ``attention_bias_lower_triangle``;
- ``dot_product_unmasked_self_attention_relative_v2`` (``t2t-huang``,
  bidirectional): a table of ``2M - 1`` rows, the spec's own.

``multihead_attention`` multiplies the query by ``depth ** -0.5`` before
these functions (so the relative key term is scaled with the content,
SCALE-3); the adapter does the same. Masks are t2t's additive biases: a
masked key gets ``large_compatible_negative(dtype)`` (-1e9, float16's min in
float16), the causal rule ``-1e9`` cast like the logits, the bias input is
added unchanged (BIAS-1). The tables reach t2t's ``tf.get_variable`` calls
through a custom getter that hands back the canonical tensor of the same
name, so gradients flow to them as to the inputs (``tf.gradients``).

tensor2tensor imports three packages at module level that these functions
never call (``tensorflow_probability``, ``tensorflow_addons``, ``tf_slim``;
their releases for TensorFlow 2.21 do not exist or pull in a TensorFlow of
their own): where one is not installed, an empty module stands in for it
before the import. Install: ``pip install -e ".[conformance,test,t2t]"``
then ``pip install --no-deps tensor2tensor==1.15.7`` (``T2T_INSTALL``).

Axis legend (AXES-1): B, H, Lq, Lk, D, d; k Shaw's max_distance, M Huang's max_len.
"""

from __future__ import annotations

import functools
import sys
import types

import numpy as np

from . import _glue
from .base import Adapter, Capabilities

T2T_INSTALL = 'pip install -e ".[conformance,test,t2t]" && pip install --no-deps tensor2tensor==1.15.7'
#: Modules tensor2tensor imports at module level and the certified functions never call.
UNUSED_IMPORTS = ("tensorflow_probability", "tensorflow_addons", "tf_slim")
#: What every t2t adapter reads from a call: the canonical parameters and the inputs it takes (no positions).
TENSORS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "rel_k", "rel_v", "query", "key", "value", "bias")
T2T_NOTES = {
    "cross-attention": "t2t's relative attention is self-attention only (q, k, v of one shape)",
    "positions": "t2t places queries and keys at arange(L) (its cache mode puts every query at the last key)",
    "custom-scale": "multihead_attention multiplies the query by depth ** -0.5",
    "unscaled-relative": "the relative logits are computed from the query already scaled",
    "no-projection-bias": "the adapter's projections carry the canonical biases",
    "mask-fill": "t2t's masks are additive biases",
    "dropout-keep": "t2t's dropout draws from TensorFlow's RNG",
    "dropout-spec": "t2t's dropout draws from TensorFlow's RNG",
    "grouped-kv-heads": "t2t has no grouped key/value heads",
    "value-head-dim": "t2t's relative attention asserts q, k and v of one shape",
    "softcap": "t2t has no soft-capping",
    "window": "t2t's relative attention has no window on distances",
    "shaw-key-side": "t2t has no key-side relative term",
}


@functools.lru_cache(maxsize=None)
def _modules():
    """(tf.compat.v1, common_attention, common_layers), importing tensor2tensor with its unused imports stood in."""
    import importlib.util

    for name in UNUSED_IMPORTS:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name)
    import tensorflow.compat.v1 as tf
    from tensor2tensor.layers import common_attention, common_layers

    return tf, common_attention, common_layers


def t2t_unavailable():
    try:
        import tensorflow  # noqa: F401
    except ImportError as e:
        return f"TensorFlow is not installed ({e}); in an environment of its own: {T2T_INSTALL}"
    try:
        _modules()
    except ImportError as e:
        return f"tensor2tensor does not import ({e}); in an environment of its own: {T2T_INSTALL}"
    return None


def _table_getter(tables: dict):
    """A ``tf.variable_scope`` custom getter: a variable whose name ends in one of ``tables``' keys is that
    tensor (the canonical table, in the call's dtype); any other variable is an error."""

    def getter(getter, name, *args, **kwargs):  # TF passes both by keyword
        for suffix, tensor in tables.items():
            if name.endswith(suffix):
                return tensor
        raise AssertionError(f"t2t asked for a variable the adapter does not map: {name}")

    return getter


class _T2TAdapter(Adapter):
    """One t2t relative attention function between the canonical projections, in a TensorFlow graph."""

    scheme: str = ""  # the scheme the function computes (Capabilities.requires)
    features: frozenset = frozenset()  # beyond mask, bias and causal
    notes: dict = {}  # beyond T2T_NOTES

    def unavailable(self):
        return t2t_unavailable()

    def environment(self):
        from importlib import metadata

        tf = _modules()[0]
        return {"tensorflow": tf.__version__, "tensor2tensor": metadata.version("tensor2tensor")}

    def capabilities(self):
        return Capabilities(
            features=frozenset({"mask", "bias", "causal"}) | self.features,
            notes={**T2T_NOTES, **self.notes},
            requires=frozenset({self.scheme}),
        )

    def attend(self, tf, ca, spec, t: dict, q, k, v, bias, saved: dict):
        """The t2t function on per-head q, k, v (B, H, L, d), its tables mapped from ``t``."""
        raise NotImplementedError

    def _run(self, spec, params, inputs, *, grad_out=None, need_weights=False) -> dict:
        tf, ca, cl = _modules()
        graph = tf.Graph()
        with graph.as_default():
            t = {n: tf.constant(np.asarray(a)) for n, a in {**params, **inputs}.items() if n in TENSORS}
            x = t["query"]
            key = t.get("key", x)
            value = t.get("value", key)
            L = inputs["query"].shape[1]

            def proj(a, w, b):  # PROJ-1, then t2t's split_heads (HEAD-1): (B, L, D) -> (B, H, L, d)
                y = tf.einsum("bld,de->ble", a, t[w])
                return ca.split_heads(y + t[b] if b in t else y, spec.num_heads)

            q = proj(x, "wq", "bq") * tf.cast(spec.effective_scale, x.dtype)  # multihead_attention's q *= d**-0.5
            k, v = proj(key, "wk", "bk"), proj(value, "wv", "bv")
            bias = None
            if inputs.get("mask") is not None:  # attention_bias_ignore_padding's rule, for any mask shape
                masked = tf.cast(tf.logical_not(tf.constant(np.asarray(inputs["mask"]))), x.dtype)
                bias = masked * ca.large_compatible_negative(x.dtype)
            if spec.causal:  # the decoder's -1e9 above the diagonal, cast like the logits (dot_product_attention)
                causal = cl.cast_like(ca.attention_bias_lower_triangle(L), x)
                bias = causal if bias is None else bias + causal
            if "bias" in t:
                bias = t["bias"] if bias is None else bias + t["bias"]
            saved = {}
            out = ca.combine_heads(self.attend(tf, ca, spec, t, q, k, v, bias, saved))  # (B, L, H * d)
            out = tf.einsum("bld,de->ble", out, t["wo"])
            out = out + t["bo"] if "bo" in t else out
            fetch = {"out": out}
            if need_weights:
                fetch["weights"] = next(w for n, w in saved.items() if not n.endswith("/logits"))
            if grad_out is not None:
                grads = tf.gradients(out, list(t.values()), grad_ys=tf.constant(np.asarray(grad_out)))
                # a table's gradient comes out of tf.gather as IndexedSlices: made dense; unused inputs get zeros
                fetch = {n: tf.zeros_like(t[n]) if g is None else tf.convert_to_tensor(g) for n, g in zip(t, grads)}
            with tf.Session(graph=graph) as sess:
                return {n: np.asarray(a) for n, a in sess.run(fetch).items()}

    def forward(self, spec, params, inputs, *, device, need_weights):
        return self._run(spec, params, inputs, need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        return self._run(spec, params, inputs, grad_out=grad_out)


class T2TShawAdapter(_T2TAdapter):
    name = "t2t-shaw"
    description = "tensor2tensor 1.15 dot_product_attention_relative (Shaw keys + values), in a TF graph"
    scheme = "shaw"
    features = frozenset({"shaw", "shaw-values"})
    notes = {
        "per-head-tables": "dot_product_attention_relative has one key and one value table for every head",
        "huang": "not Huang's scheme (t2t-huang)",
    }

    def unsupported_case(self, case):
        shaw = _glue.scheme(case.spec, "shaw")
        if shaw is not None and shaw.max_distance == 0:
            return "dot_product_attention_relative raises ValueError for max_relative_position = 0"
        return None

    def attend(self, tf, ca, spec, t, q, k, v, bias, saved):
        rel_k = t["rel_k"]
        rel_v = t["rel_v"] if "rel_v" in t else tf.zeros_like(rel_k)  # no value term: a table of zeros adds 0
        tables = {"relative_positions_keys/embeddings": rel_k, "relative_positions_values/embeddings": rel_v}
        with tf.variable_scope("t2t", custom_getter=_table_getter(tables)):
            return ca.dot_product_attention_relative(
                q, k, v, bias, spec.relative.max_distance, save_weights_to=saved, make_image_summary=False
            )


class T2THuangAdapter(_T2TAdapter):
    name = "t2t-huang"
    description = (
        "tensor2tensor 1.15 dot_product_self_attention_relative_v2 (causal) and "
        "dot_product_unmasked_self_attention_relative_v2 (Huang keys, add_relative_to_values), in a TF graph"
    )
    scheme = "huang"
    features = frozenset({"huang", "huang-values", "per-head-tables"})
    notes = {"shaw": "not Shaw's scheme (t2t-shaw)"}

    def attend(self, tf, ca, spec, t, q, k, v, bias, saved):
        huang = spec.relative
        M = huang.max_len
        # HUANG-1: the causal function's M rows are distances -(M-1) .. 0, the spec's rows 0 .. M-1; the
        # bidirectional one's 2M - 1 rows are the spec's table
        rows = (lambda a: a[..., :M, :]) if spec.causal else (lambda a: a)
        tables = {"key_relative_embeddings": rows(t["rel_k"])}
        if huang.values:
            tables["value_relative_embeddings"] = rows(t["rel_v"])
        if spec.causal:
            fn = ca.dot_product_self_attention_relative_v2
        else:
            fn = ca.dot_product_unmasked_self_attention_relative_v2
        with tf.variable_scope("t2t", custom_getter=_table_getter(tables)):
            return fn(
                q,
                k,
                v,
                bias,
                M,
                save_weights_to=saved,
                make_image_summary=False,
                heads_share_relative_embedding=not huang.per_head,
                add_relative_to_values=huang.values,
            )
