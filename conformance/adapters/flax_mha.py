"""Flax ``nnx.MultiHeadAttention`` loaded with the canonical parameters.

Mapping (spec/comparison.md): the q/k/v kernels are (D, H, d) and the out
kernel (H, d, D), so each is the canonical (D, D) weight reshaped, which is
exact (contiguous heads, HEAD-1); the map is ``jax_impl.interop``'s. The mask
is True = attend; causal masks are built top-left as ``nnx.make_causal_mask``
does. Grouped key/value heads (HEAD-3) are its ``num_kv_heads``: key and
value kernels (D, K, d), query head h reading key/value head h // G.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax
from .base import Capabilities


def to_module(spec, params: dict):
    import jax
    from flax import nnx

    from jax_impl import interop

    D, H = spec.model_dim, spec.num_heads
    dtype = np.asarray(params["wq"]).dtype
    highest = _jax.matmul_precision(dtype.name) == "highest"
    m = nnx.MultiHeadAttention(
        num_heads=H,
        num_kv_heads=spec.kv_heads,  # HEAD-3
        in_features=D,
        qkv_features=D,
        out_features=D,
        use_bias=spec.bias,
        dtype=dtype,
        param_dtype=dtype,
        precision=jax.lax.Precision.HIGHEST if highest else None,
        decode=False,
        deterministic=True,
        rngs=nnx.Rngs(0),
    )
    canonical_arrays = {n: np.asarray(params[n]) for n in interop.flax_layout(spec)}
    for n, a in interop.to_flax_layout(spec, canonical_arrays).items():  # the one layout map (jax_impl.interop)
        attr, slot = interop.FLAX_SLOTS[n]
        getattr(getattr(m, attr), slot).set_value(a)
    return m


def canonical(spec, kernels: dict) -> dict:
    """Canonical names from {attr: {"kernel": .., "bias": ..}} (module state or its gradient)."""
    from jax_impl import interop

    arrays = {
        n: np.asarray(kernels[attr][slot])
        for n, (attr, slot) in interop.FLAX_SLOTS.items()
        if n in interop.flax_layout(spec)
    }
    return interop.from_flax_layout(spec, arrays)


def _state_arrays(state) -> dict:
    return {
        attr: {name: v.get_value() for name, v in state[attr].items() if name in ("kernel", "bias")}
        for attr in ("query", "key", "value", "out")
    }


class FlaxMHAAdapter(_jax.JaxAdapter):
    name = "flax-mha"
    description = "flax.nnx.MultiHeadAttention with the canonical parameters"

    def capabilities(self):
        self.environment()
        return Capabilities(
            devices=_jax.devices(),
            features=frozenset(
                {"cross-attention", "no-projection-bias", "causal", "mask", "dropout-spec", "grouped-kv-heads"}
            ),
            weights=False,
            unsupported=_jax.UNSUPPORTED,
            notes={
                "custom-scale": "the query is divided by sqrt(head_dim)",
                "bias": "no additive bias input",
                "positions": "no position input",
                "shaw": "no relative positions",
                "huang": "no relative positions",
                "mask-fill": "its own fill value",
                "dropout-keep": "dropout from its Rngs",
                "value-head-dim": "one head size, qkv_features // num_heads, for q, k and v",
                "softcap": "no logit soft-capping option",
                "window": "no window option (only a mask the caller builds)",
            },
        )

    def extra_environment(self):
        import flax

        return {"flax": flax.__version__, "precision": "HIGHEST for float32/float64"}

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _compiled(graphdef, has_mask: bool):
        """(out, grads) = fwd_vjp(state, x, key, value, mask, grad_out), jitted per module structure."""
        import jax
        from flax import nnx

        def f(state, x, key, value, mask):
            return nnx.merge(graphdef, state)(x, key, value, mask=mask, deterministic=True)

        def fwd_vjp(state, x, key, value, mask, g):
            # One function for both, so each shape compiles once (see jax_nn).
            out, pullback = jax.vjp(lambda *a: f(*a, mask), state, x, key, value)
            return out, pullback(g)

        return jax.jit(fwd_vjp)

    def _prepare(self, spec, params, inputs, device):
        import jax
        from flax import nnx

        graphdef, state = nnx.split(to_module(spec, params))
        x, key, value = self._xkv(inputs, device)
        has_mask = bool(spec.causal or inputs.get("mask") is not None)
        mask = (
            _jax.allowed_mask(spec, inputs, x.shape[0], spec.num_heads, x.shape[1], key.shape[1]) if has_mask else None
        )
        fwd_vjp = self._compiled(graphdef, has_mask)
        return fwd_vjp, (jax.device_put(state, _jax.device_of(device)), x, key, value, mask)

    def _xkv(self, inputs, device):
        x = _jax.to_jax(inputs["query"], device)
        key = _jax.to_jax(inputs["key"], device) if "key" in inputs else x
        value = _jax.to_jax(inputs["value"], device) if "value" in inputs else key
        return x, key, value

    def forward(self, spec, params, inputs, *, device, need_weights):
        fwd_vjp, args = self._prepare(spec, params, inputs, device)
        zeros = _jax.to_jax(np.zeros(args[1].shape, args[1].dtype), device)
        return {"out": _jax.to_numpy(fwd_vjp(*args, zeros)[0])}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        fwd_vjp, args = self._prepare(spec, params, inputs, device)
        g_state, gx, gk, gv = fwd_vjp(*args, _jax.to_jax(grad_out, device))[1]
        grads = {"query": np.asarray(gx), "key": np.asarray(gk), "value": np.asarray(gv)}
        grads.update(canonical(spec, _state_arrays(g_state)))
        return grads

    def roundtrip_params(self, spec, params):
        from flax import nnx

        _, state = nnx.split(to_module(spec, params))
        return canonical(spec, _state_arrays(state))
