"""keras-hub's ``AlibiBias`` on the JAX backend, certified through the glue (ALIBI-1..5).

``keras_hub.layers.AlibiBias(alibi_bias_max, dtype=...)`` adds to attention
scores (B, H, Lq, Lk) one row per head over the key index,
``m * (j - (Lk - 1))`` with its own slope schedule (``alibi_bias_max`` is the
spec's ``max_bias``), made in the layer's compute dtype. The adapter calls
the layer on zero scores of the call's shape (adding 0 is exact), so the
glue (``_glue.jax_run``) adds the library's bias where the spec adds a
scheme's (REL-3 (3)). Like MPT's builder it is the linear form (ALIBI-3)
and takes no positions: keys at ``arange(Lk)``, any query positions (a
per-row constant). keras-hub installs with ``--no-deps`` (its
tensorflow-text requirement pulls TensorFlow), as for ``keras-hub-rope``.
"""

from __future__ import annotations

from typing import Optional

from . import _glue, _jax
from .base import Capabilities
from .jax_rope_libs import GLUE_NOTES, keras_hub_environment, keras_hub_unavailable


class KerasHubAlibiAdapter(_jax.JaxAdapter):
    name = "keras-hub-alibi"
    description = "keras_hub.layers.AlibiBias (JAX backend) in the glue"

    def unavailable(self):
        return keras_hub_unavailable()

    def extra_environment(self):
        return keras_hub_environment()

    def capabilities(self):
        self.environment()
        return Capabilities(
            devices=_jax.devices(),
            features=_glue.GLUE_FEATURES | {"alibi", "alibi-linear"},
            requires=frozenset({"alibi"}),
            notes={**GLUE_NOTES, "shaw": "an ALiBi layer only", "huang": "an ALiBi layer only"},
        )

    def unsupported_case(self, case) -> Optional[str]:
        alibi = case.spec.relative
        if getattr(alibi, "name", None) != "alibi":
            return None
        if alibi.slopes is not None:
            return "AlibiBias makes its own slopes from alibi_bias_max (ALIBI-2) and takes none of the call's"
        if not _glue.default_keys(case):
            return "AlibiBias puts the keys at arange(Lk): it takes no key positions"
        return None

    def _bias(self, spec):
        import jax.numpy as jnp
        import keras_hub

        def bias(t, qp, kp):
            x = t["query"]
            B, Lq, Lk = x.shape[0], qp.shape[-1], kp.shape[-1]
            layer = keras_hub.layers.AlibiBias(alibi_bias_max=spec.relative.max_bias, dtype=jnp.dtype(x.dtype).name)
            return layer(jnp.zeros((B, spec.num_heads, Lq, Lk), dtype=x.dtype))

        return bias

    def forward(self, spec, params, inputs, *, device, need_weights):
        return _glue.jax_run(spec, params, inputs, device, position_bias=self._bias(spec), need_weights=need_weights)

    def vjp(self, spec, params, inputs, grad_out, *, device):
        return _glue.jax_run(
            spec, params, inputs, device, position_bias=self._bias(spec), need_weights=False, grad_out=grad_out
        )
