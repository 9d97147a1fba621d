"""Argument checks at trace time (INPUT-1), worded by ``spec.validation`` (shapes and dtypes only)."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from spec import AttentionSpec
from spec.validation import ArrayInfo, Dims, check_arguments, fail_type


def kind(dtype) -> str:
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return "float"
    if dtype == np.bool_:
        return "bool"
    if jnp.issubdtype(dtype, jnp.integer):
        return "int"
    return "complex" if jnp.issubdtype(dtype, jnp.complexfloating) else "other"


def describe(name: str, x) -> Optional[ArrayInfo]:
    if x is None:
        return None
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise fail_type(name, "a jax.Array (or NumPy array)", type(x).__name__)
    return ArrayInfo(tuple(x.shape), kind(x.dtype), np.dtype(x.dtype).name)


def check(spec: AttentionSpec, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep) -> Dims:
    """INPUT-1 at ``jax_impl.attention``; raised while tracing, so jit reports it at once."""
    if np.dtype(query.dtype).name == "float64" and not jax.config.jax_enable_x64:
        raise fail_type(
            "query",
            "float64 only with jax_enable_x64 (jax.config.update('jax_enable_x64', True)); "
            "otherwise JAX would compute in float32",
            "dtype float64",
        )
    return check_arguments(
        spec, describe, params, query, key, value, mask, bias, q_positions, k_positions, dropout_keep
    )
