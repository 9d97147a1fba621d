"""ONNX Runtime (CPU) running the ONNX ``Attention`` operator with the canonical projections around it.

The same model as ``onnx-reference`` (``conformance.adapters._onnx``),
executed by ``onnxruntime.InferenceSession`` with the CPU execution provider,
one session per signature (shapes, dtype, spec options), graph optimisations
at their default level.

Certifies the runtime's ``Attention`` for the subset the operator can express:
custom scale (SCALE-1), top-left causal (CAUSAL-1 with default positions),
boolean and float masks of every broadcast rank (MASK-1, BIAS-1, BIAS-2; a
mask and a bias together are one float ``attn_mask``), fully masked rows
(MASK-5), grouped key/value heads (HEAD-3), a value head size of its own
(HEAD-4), soft-capping before the mask (SOFTCAP-1), sliding windows on the
default positions (WINDOW-1, opset 25), and the post-softmax weights
(``qk_matmul_output_mode=3``, SOFTMAX-2). A float16 call sets
``softmax_precision`` to float (PREC-4). The runtime's kernel takes masks
of rank 2 to 4 with the full query axis only; the adapter broadcasts a
mask to that form (``mask_shape``).

Not certified, and why: explicit positions (the operator has none), relative
positions, ``mask_fill``, dropout, attnspec's input validation (INPUT-1),
gradients (an inference runtime), and bfloat16 (the CPU provider has no
bfloat16 kernels for the operator's arithmetic).
"""

from __future__ import annotations

import numpy as np

from . import _onnx


class OnnxRuntimeAdapter(_onnx.OnnxAdapter):
    name = "onnxruntime"
    description = "onnxruntime.InferenceSession (CPU): ONNX Attention (opset 23/25) + canonical projections"
    UNSUPPORTED = {
        ("cpu", "bfloat16"): "the CPU execution provider has no bfloat16 kernels for Add, Expand and MatMul "
        "(NOT_IMPLEMENTED when the session is built)"
    }

    def unavailable(self):
        why = _onnx.onnx_available()
        if why:
            return why
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            return f"onnxruntime is not installed ({e}); pip install attnspec[onnx]"
        return None

    def mask_shape(self, mask, Lq):
        """``attn_mask`` with at least the axes (Lq, Lk), the query axis in full (MASK-1).

        The runtime's kernel takes a mask of rank 2 to 4 whose query axis is
        Lq (``attention_helper.h``: "attn_mask must be 2D or 3D or 4D tensor",
        "inconsistent q_sequence_length"), not every shape the operator's
        broadcasting allows; a user of the runtime broadcasts those two axes
        first, and so does this adapter. The leading axes stay as given.
        """
        shape = (1,) * max(0, 2 - mask.ndim) + mask.shape
        return np.broadcast_to(mask, shape[:-2] + (Lq, shape[-1]))

    def make_runner(self, model):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # the harness runs one process per core
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        return lambda feeds: session.run(None, feeds)

    def environment(self):
        import onnx
        import onnxruntime

        return {
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "providers": ["CPUExecutionProvider"],
            "opset": _onnx.OPSET,
            "opset_window": _onnx.OPSET_WINDOW,
        }
