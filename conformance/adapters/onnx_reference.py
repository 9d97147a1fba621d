"""ONNX's own NumPy reference of the ``Attention`` operator (``onnx.reference.ReferenceEvaluator``).

The layer is one ONNX model (``conformance.adapters._onnx``): the canonical
projections as MatMul/Add, ``Attention`` (opset 23; 25 for a window) with
3-D inputs, ``q_num_heads`` / ``kv_num_heads``, and the output projection.

Certifies the operator's semantics for the subset it can express: custom
scale (SCALE-1), top-left causal (CAUSAL-1 with default positions), boolean
and float masks of every broadcast rank (MASK-1, BIAS-1, BIAS-2; a mask and a
bias together are one float ``attn_mask``), fully masked rows (MASK-5: the
reference zeroes them), grouped key/value heads (HEAD-3), a value head size
of its own (HEAD-4), soft-capping before the mask (SOFTCAP-1), sliding windows
on the default positions (WINDOW-1), and the post-softmax weights
(``qk_matmul_output_mode=3``, SOFTMAX-2). A 16-bit call sets
``softmax_precision`` to float (PREC-4).

Not certified, and why: explicit positions (the operator has none; its
causal frontier and window are aligned top-left without a cache), relative
positions, ``mask_fill`` (masked logits are -inf), dropout (none in the
operator), attnspec's input validation (INPUT-1), gradients (an inference
evaluator). ONNX's NumPy evaluator runs every dtype, bfloat16 included.
"""

from __future__ import annotations

from . import _onnx


class OnnxReferenceAdapter(_onnx.OnnxAdapter):
    name = "onnx-reference"
    description = "onnx.reference.ReferenceEvaluator: ONNX Attention (opset 23/25) + canonical projections"

    def make_runner(self, model):
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return lambda feeds: evaluator.run(None, feeds)

    def environment(self):
        import onnx

        return {"onnx": onnx.__version__, "opset": _onnx.OPSET, "opset_window": _onnx.OPSET_WINDOW}
