"""Shared plumbing of the ONNX adapters: one model per call signature around the ``Attention`` operator.

The model is the whole layer (PROJ-1, HEAD-1..HEAD-4, OUT-1) written in ONNX:

    q = MatMul(query, wq) [+ bq]          (B, Lq, D)
    k = MatMul(key, wk) [+ bk]            (B, Lk, Hkv * d)
    v = MatMul(value, wv) [+ bv]          (B, Lk, Hkv * dv)
    y, w = Attention(q, k, v, attn_mask)  (B, Lq, H * dv), (B, H, Lq, Lk)
    out = MatMul(y, wo) [+ bo]            (B, Lq, D)

``Attention`` gets 3-D inputs with ``q_num_heads = H`` and ``kv_num_heads =
Hkv``: ONNX splits a 3-D input into heads as ``reshape(B, L, heads, size)``,
contiguous and head-major (HEAD-1), repeats each key/value head for ``G``
consecutive query heads (HEAD-3) and merges the output back the same way
(HEAD-2). The parameters are graph inputs, not initializers, so one model
serves every parameter set of a signature (shapes, dtype, spec options).

Axis legend (AXES-1): B batch, H heads, Lq / Lk query / key length, D model
dim, d head dim, Hkv key/value heads, dv value head dim.
"""

from __future__ import annotations

import collections

import numpy as np

from .base import PLAIN_FEATURES, Adapter, Capabilities

#: The opset of every model: Attention-23 has no window attributes; Attention-25 adds
#: left_window_size / right_window_size (WINDOW-1). A model without a window is still
#: built at opset 23, the first with the operator.
OPSET = 23
OPSET_WINDOW = 25
#: qk_matmul_output_mode that returns the post-softmax weights (SOFTMAX-2) as output 3.
WEIGHTS_MODE = 3
#: How many models an adapter keeps between calls (one case uses a few signatures: weights or not, twins).
CACHE_SIZE = 16

FEATURES = PLAIN_FEATURES | {"grouped-kv-heads", "value-head-dim", "softcap", "window"}
NOTES = {
    "positions": "no position input; is_causal and the window are aligned top-left without a cache",
    "shaw": "no relative positions",
    "huang": "no relative positions",
    "per-head-tables": "no relative positions",
    "unscaled-relative": "no relative positions",
    "mask-fill": "masked logits are -inf; no fill value",
    "dropout-spec": "the Attention operator has no dropout",
    "dropout-keep": "the Attention operator has no dropout",
    "validates-input": "ONNX checks shapes against the model, not attnspec's INPUT-1 messages",
}


def onnx_available():
    """Why the ONNX adapters cannot run here (onnx missing), or None."""
    try:
        import onnx  # noqa: F401
    except ImportError as e:
        return f"onnx is not installed ({e}); pip install attnspec[onnx]"
    return None


def tensor_type(dtype: np.dtype) -> int:
    """The ONNX element type of a NumPy dtype (float64, float32, float16, ml_dtypes.bfloat16, bool).

    The model computes in the dtype of the call (PREC-1: the adapter casts nothing).
    """
    from onnx import TensorProto

    types = {
        "float64": TensorProto.DOUBLE,
        "float32": TensorProto.FLOAT,
        "float16": TensorProto.FLOAT16,
        "bfloat16": TensorProto.BFLOAT16,
        "bool": TensorProto.BOOL,
    }
    name = np.dtype(dtype).name
    if name not in types:
        raise TypeError(f"onnx adapter: expected one of {', '.join(types)}, got {name}")
    return types[name]


def attn_mask(inputs: dict, dtype: np.dtype):
    """ONNX's one ``attn_mask`` from attnspec's mask and bias (MASK-1, BIAS-1, BIAS-2, MASK-4).

    A mask alone stays boolean (True = attend, as in attnspec); a bias alone is
    the float mask, ``-inf`` disallowing a key. Both together become one float
    mask, ``where(mask, bias, -inf)``, broadcast to their common shape. Every
    other shape is passed as given: ONNX broadcasts ``attn_mask`` from the right
    to (B, H, Lq, Lk) like MASK-1.
    """
    mask, bias = inputs.get("mask"), inputs.get("bias")
    if bias is None:
        return mask
    if mask is None:
        return np.asarray(bias, dtype)
    mask, bias = np.broadcast_arrays(np.asarray(mask), np.asarray(bias, dtype))
    return np.where(mask, bias, dtype.type(-np.inf)).astype(dtype)


def build_model(spec, feeds: dict, need_weights: bool):
    """The ONNX model of the layer for these feeds (names and shapes) and spec options.

    Implements PROJ-1, HEAD-1..HEAD-4, SCALE-1, SOFTCAP-1, CAUSAL-1 (top-left),
    WINDOW-1 (default positions), MASK-1, BIAS-1, OUT-1 by the operator's own
    attributes; see the module docstring for the graph.
    """
    from onnx import helper

    dtype = feeds["query"].dtype
    elem = tensor_type(dtype)
    nodes = []

    def linear(x, w, b, out):
        y = out if b not in feeds else f"{out}_nobias"
        nodes.append(helper.make_node("MatMul", [x, w], [y]))
        if b in feeds:
            nodes.append(helper.make_node("Add", [y, b], [out]))

    linear("query", "wq", "bq", "q")
    linear("key", "wk", "bk", "k")
    linear("value", "wv", "bv", "v")
    attrs = {"q_num_heads": spec.num_heads, "kv_num_heads": spec.kv_heads}
    if spec.scale is not None:
        attrs["scale"] = float(spec.scale)
    if spec.causal:
        attrs["is_causal"] = 1
    if spec.softcap is not None:
        attrs["softcap"] = float(spec.softcap)
    opset = OPSET
    if spec.window is not None:  # WINDOW-1: ONNX's -1 is attnspec's None
        left, right = spec.window
        attrs["left_window_size"] = -1 if left is None else int(left)
        attrs["right_window_size"] = -1 if right is None else int(right)
        opset = OPSET_WINDOW
    if dtype.itemsize == 2:  # PREC-4: the softmax of a 16-bit call in float32
        from onnx import TensorProto

        attrs["softmax_precision"] = TensorProto.FLOAT
    outputs = ["y"]
    if need_weights:
        attrs["qk_matmul_output_mode"] = WEIGHTS_MODE
        outputs = ["y", "", "", "weights"]
    inputs = ["q", "k", "v"] + (["attn_mask"] if "attn_mask" in feeds else [])
    nodes.append(helper.make_node("Attention", inputs, outputs, **attrs))
    linear("y", "wo", "bo", "out")
    graph_inputs = [helper.make_tensor_value_info(n, tensor_type(a.dtype), list(a.shape)) for n, a in feeds.items()]
    graph_outputs = [helper.make_tensor_value_info("out", elem, None)]
    if need_weights:
        graph_outputs.append(helper.make_tensor_value_info("weights", elem, None))
    graph = helper.make_graph(nodes, "attnspec_layer", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return model


class OnnxAdapter(Adapter):
    """Base of the ONNX adapters: feeds, one cached runner per signature, the call (SHAPE-2, PARAM-1)."""

    #: the dtypes the runtime executes, and why the others cannot run
    DTYPES: tuple = ("float64", "float32", "bfloat16", "float16")
    UNSUPPORTED: dict = {}

    def __init__(self):
        self._cache: collections.OrderedDict = collections.OrderedDict()

    def unavailable(self):
        return onnx_available()

    def capabilities(self):
        return Capabilities(
            dtypes=self.DTYPES,
            devices=("cpu",),
            features=FEATURES,
            weights=True,
            gradients=False,
            notes=NOTES,
            unsupported=dict(self.UNSUPPORTED),
        )

    def make_runner(self, model):
        """A callable feeds -> list of outputs for the model (the runtime under test)."""
        raise NotImplementedError

    def mask_shape(self, mask: np.ndarray, Lq: int) -> np.ndarray:
        """The ``attn_mask`` as this runtime takes it (MASK-1: any shape broadcastable to (B, H, Lq, Lk))."""
        return mask

    def _runner(self, spec, feeds: dict, need_weights: bool):
        signature = (
            spec,
            need_weights,
            tuple((n, a.dtype.name, a.shape) for n, a in feeds.items()),
        )
        runner = self._cache.get(signature)
        if runner is None:
            runner = self.make_runner(build_model(spec, feeds, need_weights))
            self._cache[signature] = runner
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(signature)
        return runner

    def forward(self, spec, params, inputs, *, device, need_weights):
        dtype = np.asarray(inputs["query"]).dtype
        query = inputs["query"]
        key = inputs.get("key", query)  # SHAPE-2
        value = inputs.get("value", key)
        feeds = {"query": query, "key": key, "value": value}
        feeds.update((n, params[n]) for n in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo") if n in params)
        mask = attn_mask(inputs, dtype)
        if mask is not None:
            feeds["attn_mask"] = self.mask_shape(np.asarray(mask), query.shape[1])
        feeds = {n: np.ascontiguousarray(a) for n, a in feeds.items()}
        outputs = self._runner(spec, feeds, need_weights)(feeds)
        result = {"out": outputs[0]}
        if need_weights:
            result["weights"] = outputs[1]
        return result

    def release(self):
        self._cache.clear()
