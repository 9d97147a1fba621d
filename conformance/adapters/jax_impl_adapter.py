"""``jax_impl``, attnspec's own JAX implementation, jit-compiled: every feature, CPU and GPU."""

from __future__ import annotations

import functools

import numpy as np

from . import _jax
from .base import Capabilities

DIFF_INPUTS = ("query", "key", "value", "bias")


class JaxImplAdapter(_jax.JaxAdapter):
    name = "jax"
    description = "jax_impl.attention under jax.jit, gradients by jax.vjp"

    def capabilities(self):
        self.environment()
        return Capabilities(devices=_jax.devices())

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _compiled(spec, precision):
        """(out, weights, grads) = f(params, diff_inputs, other_inputs, grad_out), jitted per spec."""
        import jax
        import jax_impl

        def fwd_vjp(params, diff, other, g, self_attention):
            def f(params, diff):
                with jax.default_matmul_precision(precision):
                    return jax_impl.attention(spec, params, diff["query"], diff.get("key"), diff.get("value"),
                                              bias=diff.get("bias"), **other, return_weights=True)

            out, pullback, weights = jax.vjp(f, params, diff, has_aux=True)
            if self_attention:
                # The forward of a self-attention case omits key and value (SHAPE-2) while its
                # gradients are partials for three separate inputs: both in one program, so that
                # each case compiles once.
                explicit = {n: a for n, a in diff.items() if n not in ("key", "value")}
                out, weights = f(params, explicit)
            return out, weights, pullback(g)

        return jax.jit(fwd_vjp, static_argnames="self_attention")

    def _run(self, spec, params, inputs, grad_out, device):
        x = inputs["query"]
        fn = self._compiled(spec, _jax.matmul_precision(x.dtype.name))
        # A vjp call carries explicit copies of the query; recognising them lets the forward
        # and the gradients of a self-attention case share one compiled program.
        self_attention = "key" not in inputs or (
            np.array_equal(inputs["key"], x) and np.array_equal(inputs.get("value", inputs["key"]), x))
        inputs = {"key": x, "value": inputs.get("key", x), **inputs}  # explicit leaves for the vjp
        p = {n: _jax.to_jax(a, device) for n, a in params.items()}
        diff = {n: _jax.to_jax(inputs[n], device) for n in DIFF_INPUTS if n in inputs}
        other = {n: _jax.to_jax(a, device) for n, a in inputs.items() if n not in DIFF_INPUTS}
        g = _jax.to_jax(np.zeros(x.shape, x.dtype) if grad_out is None else grad_out, device)
        return fn(p, diff, other, g, self_attention=self_attention)

    def forward(self, spec, params, inputs, *, device, need_weights):
        out, weights, _ = self._run(spec, params, inputs, None, device)
        result = {"out": np.asarray(out)}
        if need_weights:
            result["weights"] = np.asarray(weights)
        return result

    def vjp(self, spec, params, inputs, grad_out, *, device):
        _, _, (g_params, g_inputs) = self._run(spec, params, inputs, grad_out, device)
        return {n: np.asarray(g) for n, g in {**g_params, **g_inputs}.items()}

    def roundtrip_params(self, spec, params):
        from flax import nnx

        import jax_impl

        m = jax_impl.MultiHeadAttention(spec, rngs=nnx.Rngs(0), dtype=params["wq"].dtype)
        return m.load_canonical({n: np.asarray(a) for n, a in params.items()}).canonical_params()

    def relative_indices(self, spec, q_positions, k_positions, B, Lq, Lk):
        import jax.numpy as jnp

        from jax_impl import relative
        from spec import Shaw

        qp = jnp.arange(Lq) if q_positions is None else jnp.asarray(q_positions)
        kp = jnp.arange(Lk) if k_positions is None else jnp.asarray(k_positions)
        delta = kp.reshape(-1, Lk)[:, None, :] - qp.reshape(-1, Lq)[:, :, None]
        if isinstance(spec.relative, Shaw):
            return np.asarray(relative.shaw_index(delta, spec.relative.max_distance))
        row, valid = relative.huang_index(delta, spec.relative.max_len)
        return np.asarray(jnp.where(valid, row, -1))
