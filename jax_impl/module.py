"""``MultiHeadAttention``: a Flax NNX module that owns the parameters and calls the core.

Kernels are kept in Flax's layout: ``q_kernel``, ``k_kernel``, ``v_kernel``
``(D, H, d)`` with biases ``(H, d)``, ``out_kernel`` ``(H, d, D)`` with bias
``(D,)`` — as ``nnx.MultiHeadAttention`` keeps them — and ``rel_k`` / ``rel_v``
tables of the canonical shape. Reshaping is the exact conversion to and from
the canonical ``(D, D)`` weights (contiguous heads, HEAD-1; PARAM-3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spec import AttentionSpec
from spec.validation import fail_type, fail_value

from . import functional

PROJ = ("q", "k", "v")


def _as_numpy(x) -> np.ndarray:
    return np.array(x, copy=True)


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with optional Shaw or Huang relative positions (spec/attention.md).

    Args:
      spec: the ``AttentionSpec``.
      rngs: ``nnx.Rngs`` for initialisation and (stream ``dropout``, else
        ``default``) for dropout in training mode.
      dtype: parameter and computation dtype (default float32).

    Initialisation: kernels LeCun-normal (Flax's default), biases zero, tables
    N(0, 0.02^2). ``__call__`` takes the keywords of ``jax_impl.attention``; with
    ``deterministic=False`` (training, the default; ``.eval()`` sets it) and
    ``spec.dropout > 0`` the keep mask is drawn with P(keep) = 1 - p (DROP-3).
    """

    def __init__(self, spec: AttentionSpec, *, rngs: nnx.Rngs, dtype=jnp.float32):
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
        self.spec = spec
        self.deterministic = False
        self.rngs = rngs
        D, H, d = spec.model_dim, spec.num_heads, spec.head_dim
        init = nnx.initializers.lecun_normal()
        for n in PROJ:
            setattr(self, f"{n}_kernel", nnx.Param(init(rngs.params(), (D, D), dtype).reshape(D, H, d)))
            if spec.bias:
                setattr(self, f"{n}_bias", nnx.Param(jnp.zeros((H, d), dtype)))
        self.out_kernel = nnx.Param(init(rngs.params(), (D, D), dtype).reshape(H, d, D))
        if spec.bias:
            self.out_bias = nnx.Param(jnp.zeros((D,), dtype))
        shapes = spec.param_shapes()
        for n in ("rel_k", "rel_v"):
            if n in shapes:
                setattr(self, n, nnx.Param(0.02 * jax.random.normal(rngs.params(), shapes[n], dtype)))

    def params(self) -> dict:
        """Canonical arrays (reshaped views of the kernels)."""
        D = self.spec.model_dim
        out = {}
        for n in PROJ:
            out["w" + n] = self.__dict__[f"{n}_kernel"][...].reshape(D, D)
            if self.spec.bias:
                out["b" + n] = self.__dict__[f"{n}_bias"][...].reshape(D)
        out["wo"] = self.out_kernel[...].reshape(D, D)
        if self.spec.bias:
            out["bo"] = self.out_bias[...]
        for n in ("rel_k", "rel_v"):
            if hasattr(self, n):
                out[n] = getattr(self, n)[...]
        return out

    def load_canonical(self, params: dict) -> "MultiHeadAttention":
        """Set every parameter from a canonical set of the module's dtype, exactly."""
        if not isinstance(params, dict):
            raise TypeError(f"params: expected a dict of arrays, got {type(params).__name__}")
        expected = self.spec.param_shapes()
        missing = [n for n in expected if n not in params]
        extra = sorted(n for n in params if n not in expected)
        if missing or extra:
            raise fail_value("params", f"entries {list(expected)} for this spec",
                             f"missing {missing}, unexpected {extra}")
        D, H, d = self.spec.model_dim, self.spec.num_heads, self.spec.head_dim
        dtype = np.dtype(self.out_kernel[...].dtype)
        for name, shape in expected.items():
            a = params[name]
            if np.dtype(a.dtype) != dtype:
                raise fail_type("params", f"arrays of the module's dtype {dtype.name} (cast them explicitly first)",
                                f"dtype {np.dtype(a.dtype).name}")
            if tuple(a.shape) != shape:
                raise fail_value(f"params[{name!r}]", f"shape {shape}", tuple(a.shape))
        for n in PROJ:
            self.__dict__[f"{n}_kernel"].set_value(jnp.asarray(params["w" + n]).reshape(D, H, d))
            if self.spec.bias:
                self.__dict__[f"{n}_bias"].set_value(jnp.asarray(params["b" + n]).reshape(H, d))
        self.out_kernel.set_value(jnp.asarray(params["wo"]).reshape(H, d, D))
        if self.spec.bias:
            self.out_bias.set_value(jnp.asarray(params["bo"]))
        for n in ("rel_k", "rel_v"):
            if n in params:
                getattr(self, n).set_value(jnp.asarray(params[n]))
        return self

    def canonical_params(self) -> dict:
        """The parameters in the canonical layout as NumPy arrays, exactly (PARAM-3)."""
        return {n: _as_numpy(a) for n, a in self.params().items()}

    def __call__(self, query, key=None, value=None, *, mask=None, bias=None, q_positions=None,
                 k_positions=None, dropout_keep=None, return_weights: bool = False, deterministic=None):
        deterministic = self.deterministic if deterministic is None else deterministic
        if dropout_keep is None and not deterministic and self.spec.dropout > 0:
            B, Lq, _ = query.shape
            Lk = (query if key is None else key).shape[1]
            dropout_keep = jax.random.bernoulli(self.rngs.dropout(), 1.0 - self.spec.dropout,
                                                (B, self.spec.num_heads, Lq, Lk))
        return functional.attention(self.spec, self.params(), query, key, value, mask=mask, bias=bias,
                                    q_positions=q_positions, k_positions=k_positions,
                                    dropout_keep=dropout_keep, return_weights=return_weights)
