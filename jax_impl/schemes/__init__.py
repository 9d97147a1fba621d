"""Position schemes in JAX: one module per scheme, found by ``scheme.name`` (REL-3, REL-4).

A scheme (``spec.Shaw``, ``spec.Huang``, ...) says *what* it adds through
the hooks it lists in ``scheme.hooks`` (from ``spec.HOOKS``); its module
here says how. Kernels (``jax_impl.kernels``) get the hooks as a ``Hooks``
tuple from ``plain_hooks`` or ``tiled_hooks`` and never look at the
scheme's type or name.

Hook protocol. ``params`` is the canonical dict; ``delta`` the integer
distances k_pos - q_pos, (1|B, Lq, Lk) (POS-2); positions are (1|B, L)
(POS-1). Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv key/value heads
(HEAD-3), dv the value head dim (HEAD-4). Applied in the order of REL-3:

1. ``qk_transform(scheme, params, q, k, q_positions, k_positions) -> (q, k)``,
   q (B, H, Lq, d), k (B, Hkv, Lk, d), after the head split (RoPE);
2. ``key_term(scheme, params, q, delta) -> (B, H, Lq, Lk)`` from the
   (transformed) q, before the factor s_rel that the kernel applies (SCALE-3);
3. ``bias(scheme, params, q_positions, k_positions, delta, *, num_heads, dtype)
   -> (1|B, 1|H, Lq, Lk)``, finite, in ``dtype`` (the softmax dtype, PREC-4:
   float32 for the 16-bit inputs), added unscaled like the ``bias`` input
   (SCALE-4; ALiBi, T5, Swin); ``num_heads`` is H (ALiBi's slopes depend on
   it), both keywords static Python values; Swin reads the positions, not
   only delta (SWIN-6);
2b. ``key_side_term(scheme, params, k, delta, *, num_heads) -> (B, H, Lq, Lk)``
   from the key heads k (B, Hkv, Lk, d) (HEAD-3), before the factor
   ``spec.key_side_scale`` that the kernel applies (Shaw's key side, SHAW-6,
   SHAW-7); ``num_heads`` is H, a static Python value;
4. ``value_term(scheme, params, w, delta) -> (B, H, Lq, dv)`` from the
   weights after dropout w' (B, H, Lq, Lk) (DROP-4), added to ``w' @ v``.

These plain hooks are the readable algorithms the ``xla`` kernel calls
over whole (B, H, Lq, Lk) arrays; every module defines the ones its scheme
uses. The ``tiles`` kernel calls ``qk_transform`` once per call, then per
block of queries the *tiled* hooks ``key_term_tiled``,
``key_side_term_tiled``, ``bias_tiled`` and ``value_term_tiled``: the same signatures plus a ``Tile`` (where the block
sits, whether positions are the defaults, whether the caller masks the
keys after the diagonal). A module without them is simply not supported
by ``tiles`` (``missing_tiled``, KERN-1).

An outside scheme plugs in with ``spec.register`` (its class) and
``register_module(name, module)`` (its jax_impl module).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

from spec import HOOKS
from spec.schemes import ModuleRegistry

__all__ = [
    "REGISTRY",
    "PLAIN",
    "TILED",
    "Hooks",
    "Tile",
    "NO_HOOKS",
    "module_for",
    "register_module",
    "plain_hooks",
    "tiled_hooks",
    "missing_tiled",
]

#: scheme name -> its jax_impl module (a dotted path, imported on first use, or a module object) (REL-4).
REGISTRY = ModuleRegistry(
    "jax_impl",
    {
        "shaw": "jax_impl.schemes.shaw",
        "huang": "jax_impl.schemes.huang",
        "rope": "jax_impl.schemes.rope",
        "alibi": "jax_impl.schemes.alibi",
        "t5": "jax_impl.schemes.t5",
        "swin": "jax_impl.schemes.swin",
    },
)

#: hook kind -> the function a module defines for it, for the xla kernel and for the tiles kernel.
PLAIN = {kind: kind for kind in HOOKS}
TILED = {
    "qk_transform": "qk_transform",
    "key_term": "key_term_tiled",
    "key_side_term": "key_side_term_tiled",
    "bias": "bias_tiled",
    "value_term": "value_term_tiled",
}


class Tile(NamedTuple):
    """Where a block of queries sits, for the tiled hooks (static Python values).

    The block holds the queries q_start .. q_start + Lq - 1 of the call and
    the keys 0 .. Lk - 1 (the shapes of its arrays say Lq and Lk).
    """

    q_start: int
    default_positions: bool  # q_positions and k_positions both None: delta_ij = j - (q_start + i)
    causal: bool  # the caller masks every key after the diagonal (CAUSAL-1): a term may be any finite number there


class Hooks(NamedTuple):
    """One call's hooks, bound to the scheme (and a Tile); None for a kind the scheme does not use (REL-3)."""

    qk_transform: Optional[Callable] = None  # (params, q, k, q_positions, k_positions) -> (q, k), k (B, Hkv, Lk, d)
    key_term: Optional[Callable] = None  # (params, q, delta) -> (B, H, Lq, Lk), before s_rel
    key_side_term: Optional[Callable] = None  # (params, k, delta, *, num_heads) -> (B, H, Lq, Lk), SHAW-6
    bias: Optional[Callable] = None  # (params, q_pos, k_pos, delta, *, num_heads, dtype) -> (1|B, 1|H, Lq, Lk)
    value_term: Optional[Callable] = None  # (params, w', delta) -> (B, H, Lq, dv)


NO_HOOKS = Hooks()


register_module = REGISTRY.register_module
module_for = REGISTRY.module_for


def _kinds(scheme) -> tuple:
    """The hook kinds ``scheme`` uses, in HOOKS order (REL-3)."""
    unknown = sorted(set(scheme.hooks) - set(HOOKS))
    if unknown:
        raise ValueError(f"{scheme.name}.hooks: expected hook kinds from {HOOKS} [REL-3], got {unknown}")
    return tuple(kind for kind in HOOKS if kind in scheme.hooks)


def _missing(scheme, functions: dict) -> list:
    module = module_for(scheme)
    return [functions[kind] for kind in _kinds(scheme) if not callable(getattr(module, functions[kind], None))]


def missing_tiled(scheme) -> list:
    """The tiled hook functions the module of ``scheme`` lacks ([] for None): what ``tiles`` would need."""
    return [] if scheme is None else _missing(scheme, TILED)


def plain_hooks(scheme) -> Hooks:
    """The plain hooks of ``scheme`` (None: no hooks); ValueError when its module lacks one (REL-3, REL-4)."""
    if scheme is None:
        return NO_HOOKS
    missing = _missing(scheme, PLAIN)
    if missing:
        raise ValueError(
            f"{_module_name(module_for(scheme))}: expected the functions {missing} for the hooks "
            f"{list(_kinds(scheme))} of scheme {scheme.name!r} [REL-3], got a module without them"
        )
    module = module_for(scheme)
    return Hooks(**{kind: functools.partial(getattr(module, PLAIN[kind]), scheme) for kind in _kinds(scheme)})


def tiled_hooks(scheme, tile: Tile) -> Hooks:
    """The tiled hooks of ``scheme`` for one block of queries (the caller checked ``missing_tiled``)."""
    if scheme is None:
        return NO_HOOKS
    module = module_for(scheme)
    hooks = {}
    for kind in _kinds(scheme):
        function = functools.partial(getattr(module, TILED[kind]), scheme)
        hooks[kind] = function if kind == "qk_transform" else functools.partial(function, tile=tile)
    return Hooks(**hooks)


def _module_name(module) -> str:
    return module if isinstance(module, str) else getattr(module, "__name__", repr(module))
