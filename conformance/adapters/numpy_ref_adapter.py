"""The reference itself: computes in float64 on whatever dtype it is given.

It must pass everything with a margin of about 0 (its error is the float64
reference against itself on the same rounded inputs).
"""

from __future__ import annotations

import numpy as np

import numpy_ref

from .base import FEATURES, REFERENCE_FEATURES, Adapter, Capabilities

KWARGS = ("mask", "bias", "q_positions", "k_positions", "dropout_keep")


class NumpyRefAdapter(Adapter):
    name = "numpy"
    description = "numpy_ref, the float64 reference (PREC-1)"

    def capabilities(self) -> Capabilities:
        return Capabilities(features=FEATURES | REFERENCE_FEATURES)

    def forward(self, spec, params, inputs, *, device, need_weights):
        kw = {n: inputs[n] for n in KWARGS if n in inputs}
        out, w = numpy_ref.attention(
            spec, params, inputs["query"], inputs.get("key"), inputs.get("value"), **kw, return_weights=True
        )
        return {"out": out, "weights": w} if need_weights else {"out": out}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        kw = {n: inputs[n] for n in KWARGS if n in inputs}
        return numpy_ref.attention_vjp(spec, params, inputs["query"], inputs["key"], inputs["value"], grad_out, **kw)

    def environment(self):
        return {"numpy": np.__version__, "compute_dtype": "float64"}


class NumpyBlockwiseAdapter(NumpyRefAdapter):
    """The reference evaluated over a split of the keys (BLOCK-1..BLOCK-4): every case's keys in ``SHARDS``
    consecutive blocks, each block a call of its own with its keys' global positions and its columns of the
    mask, bias and keep mask, the blocks combined by their maxima and denominators. It certifies
    ``numpy_ref.attention_blockwise`` and ``numpy_ref.attention_blockwise_vjp`` (BLOCK-6) against every golden
    (it returns no weights)."""

    name = "numpy:blockwise"
    description = (
        "numpy_ref.attention_blockwise and attention_blockwise_vjp: the reference over 3 blocks of keys, combined "
        "(BLOCK-1..BLOCK-4), its gradients block by block (BLOCK-6)"
    )
    SHARDS = 3

    def capabilities(self) -> Capabilities:
        return Capabilities(features=FEATURES, weights=False)

    def blocks(self, inputs) -> list:
        Lk = inputs.get("key", inputs["query"]).shape[1]
        return [len(b) for b in np.array_split(np.arange(Lk), self.SHARDS)]

    def forward(self, spec, params, inputs, *, device, need_weights):
        kw = {n: inputs[n] for n in KWARGS if n in inputs}
        out = numpy_ref.attention_blockwise(
            spec, params, inputs["query"], inputs.get("key"), inputs.get("value"), key_blocks=self.blocks(inputs), **kw
        )
        return {"out": out}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        kw = {n: inputs[n] for n in KWARGS if n in inputs}
        x = (inputs["query"], inputs["key"], inputs["value"])
        return numpy_ref.attention_blockwise_vjp(spec, params, *x, grad_out, key_blocks=self.blocks(inputs), **kw)
