"""``MultiHeadAttention``: a Flax NNX module that owns the parameters and calls the core.

Kernels are kept in Flax's layout (``interop.flax_layout``): ``q_kernel``
``(D, H, d)``, ``k_kernel`` ``(D, Hkv, d)``, ``v_kernel`` ``(D, Hkv, dv)``
with biases ``(H, d)``, ``(Hkv, d)``, ``(Hkv, dv)``, ``out_kernel``
``(H, dv, D)`` with bias ``(D,)`` — as ``nnx.MultiHeadAttention`` keeps them
— and the scheme's tables (``TABLES``: ``rel_k``, ``rel_q``, ``rel_v``, ``rel_b``) of the
canonical shape. Every shape comes from ``spec.param_shapes()`` (PARAM-1,
HEAD-3, HEAD-4). Reshaping is the exact conversion to and from the
canonical weights (contiguous heads, HEAD-1; PARAM-3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spec import AttentionSpec
from spec.validation import check_params, fail_type

from . import _checks, functional
from .interop import flax_layout, from_flax_layout, to_flax_layout

#: canonical parameter name -> the module's attribute holding it
ATTRS = {
    "wq": "q_kernel",
    "wk": "k_kernel",
    "wv": "v_kernel",
    "wo": "out_kernel",
    "bq": "q_bias",
    "bk": "k_bias",
    "bv": "v_bias",
    "bo": "out_bias",
    "rel_k": "rel_k",
    "rel_q": "rel_q",
    "rel_v": "rel_v",
    "rel_b": "rel_b",
}
#: the canonical tables a position scheme may add (PARAM-1), kept in their canonical shape
TABLES = ("rel_k", "rel_q", "rel_v", "rel_b")


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with an optional position scheme (``spec.relative``; spec/attention.md).

    Args:
      spec: the ``AttentionSpec``.
      rngs: ``nnx.Rngs`` for initialisation and (stream ``dropout``, else
        ``default``) for dropout in training mode.
      dtype: parameter and computation dtype (default float32).

    Initialisation: kernels LeCun-normal (Flax's default), biases zero, tables
    N(0, 0.02^2). ``__call__`` takes the keywords of ``jax_impl.attention``
    (``implementation=`` included, KERN-1); with ``deterministic=False``
    (training, the default; ``.eval()`` sets it) and ``spec.dropout > 0`` the
    keep mask is drawn with P(keep) = 1 - p (DROP-3).
    """

    def __init__(self, spec: AttentionSpec, *, rngs: nnx.Rngs, dtype=jnp.float32):
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec: expected an AttentionSpec, got {type(spec).__name__}")
        self.spec = spec
        self.deterministic = False
        self.rngs = rngs
        shapes = spec.param_shapes()
        init = nnx.initializers.lecun_normal()
        canonical = {n: init(rngs.params(), shapes[n], dtype) for n in ("wq", "wk", "wv", "wo")}
        if spec.bias:
            canonical.update({n: jnp.zeros(shapes[n], dtype) for n in ("bq", "bk", "bv", "bo")})
        tables = {n: 0.02 * jax.random.normal(rngs.params(), shapes[n], dtype) for n in TABLES if n in shapes}
        for n, a in {**to_flax_layout(spec, canonical), **tables}.items():
            setattr(self, ATTRS[n], nnx.Param(a))

    def params(self) -> dict:
        """Canonical arrays (reshaped views of the kernels)."""
        flax = {n: getattr(self, ATTRS[n])[...] for n in flax_layout(self.spec)}
        tables = {n: getattr(self, ATTRS[n])[...] for n in TABLES if hasattr(self, ATTRS[n])}
        return {**from_flax_layout(self.spec, flax), **tables}

    def load_canonical(self, params: dict) -> "MultiHeadAttention":
        """Set every parameter from a canonical set of the module's dtype, exactly (PARAM-1, PARAM-2)."""
        if isinstance(params, dict):  # the checks and wording of jax_impl.attention's own (PARAM-2)
            check_params(self.spec, {n: _checks.describe(f"params[{n!r}]", a) for n, a in params.items()})
        else:
            check_params(self.spec, params)  # TypeError: expected a dict of arrays
        dtype = np.dtype(self.out_kernel[...].dtype)
        for a in params.values():
            if np.dtype(a.dtype) != dtype:
                raise fail_type(
                    "params",
                    f"arrays of the module's dtype {dtype.name} (cast them explicitly first)",
                    f"dtype {np.dtype(a.dtype).name}",
                )
        arrays = {n: jnp.asarray(a) for n, a in params.items()}
        tables = {n: a for n, a in arrays.items() if n in TABLES}
        for n, a in {**to_flax_layout(self.spec, arrays), **tables}.items():
            getattr(self, ATTRS[n]).set_value(a)
        return self

    def canonical_params(self) -> dict:
        """The parameters in the canonical layout as NumPy arrays, exactly (PARAM-3)."""
        return {n: np.array(a, copy=True) for n, a in self.params().items()}

    def __call__(
        self,
        query,
        key=None,
        value=None,
        *,
        mask=None,
        bias=None,
        q_positions=None,
        k_positions=None,
        dropout_keep=None,
        return_weights: bool = False,
        deterministic=None,
        implementation=None,
    ):
        deterministic = self.deterministic if deterministic is None else deterministic
        if dropout_keep is None and not deterministic and self.spec.dropout > 0:
            B, Lq, _ = query.shape
            Lk = (query if key is None else key).shape[1]
            dropout_keep = jax.random.bernoulli(
                self.rngs.dropout(), 1.0 - self.spec.dropout, (B, self.spec.num_heads, Lq, Lk)
            )
        return functional.attention(
            self.spec,
            self.params(),
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            q_positions=q_positions,
            k_positions=k_positions,
            dropout_keep=dropout_keep,
            return_weights=return_weights,
            implementation=implementation,
        )
