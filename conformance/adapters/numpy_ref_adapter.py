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
