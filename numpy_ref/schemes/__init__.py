"""Position schemes as units: one module per scheme, found by ``scheme.name`` (REL-3, REL-4).

A scheme (``spec.Shaw``, ``spec.Huang``, ...) says *what* it adds to
attention; its numpy_ref module says how, through at most five hooks that
the core (``forward``, ``backward``, ``definition``) applies in the order of
``spec.HOOKS`` (REL-3). Nothing outside a scheme's own module looks at the
scheme's type: the core asks ``bind(scheme)`` for the module and calls the
hooks the scheme lists in ``scheme.hooks``.

Hook protocol. Every hook is optional; a module defines the hooks its
scheme uses, each with its VJP. ``params`` is the float64 canonical dict,
``ctx`` a ``Context``; ``saved`` is whatever the hook wants back in its VJP
(the ``Trace`` keeps it); ``grads`` maps table names to gradients of the
tables' own shapes. Axis legend (AXES-1): B, H, Lq, Lk, D, d.

1. ``qk_transform(scheme, params, q, k, ctx) -> (q, k, saved)``, q (B, H, Lq, d),
   k (B, H, Lk, d), applied after the head split and before any logit;
   ``qk_transform_vjp(scheme, params, saved, dq, dk) -> (dq, dk, grads)``.
2. ``key_term(scheme, params, q, ctx) -> (term, saved)``, term (B, H, Lq, Lk),
   computed from the (transformed) q; the core multiplies it by
   ``spec.relative_scale`` (SCALE-3). ``key_term_vjp(scheme, params, saved,
   g_term) -> (dq, grads)``, g_term the gradient of the unscaled term.
2b. ``key_side_term(scheme, params, k, ctx) -> (term, saved)``, term (B, H, Lq,
   Lk), computed from the (transformed) k of each query head (B, H, Lk, d);
   the core multiplies it by ``spec.key_side_scale`` (SHAW-7).
   ``key_side_term_vjp(scheme, params, saved, g_term) -> (dk, grads)``.
3. ``bias(scheme, params, ctx) -> (bias, saved)``, bias finite and
   broadcastable to (B, H, Lq, Lk), added to the logits unscaled like the
   ``bias`` input (BIAS-1); ``bias_vjp(scheme, params, saved, g) -> grads``,
   g (B, H, Lq, Lk).
4. ``value_term(scheme, params, w, ctx) -> (o_add, saved)``, w the weights
   after dropout (B, H, Lq, Lk) (DROP-4), o_add (B, H, Lq, d) added to
   ``w @ v``; ``value_term_vjp(scheme, params, saved, g_o) -> (d_w, grads)``.

For ``numpy_ref.definition`` (the loop-level transcription) each hook has
a literal form over one head ``h`` and plain Python numbers, with
``q_pos``, ``k_pos`` integer positions (delta = k_pos - q_pos, POS-2):

1. ``literal_q(scheme, params, h, q_vec, q_pos) -> vector`` and
   ``literal_k(scheme, params, h, k_vec, k_pos) -> vector``;
2. ``literal_key_term(scheme, params, h, q_vec, q_pos, k_pos) -> float``;
2b. ``literal_key_side_term(scheme, params, h, k_vec, q_pos, k_pos) -> float``;
3. ``literal_bias(scheme, params, h, num_heads, q_pos, k_pos) -> float``
   (ALiBi's slopes depend on the number of heads);
4. ``literal_value_row(scheme, params, h, q_pos, k_pos) -> vector (d,)``,
   the row that key k_pos adds to query q_pos's output with its weight.

An outside scheme plugs in with ``spec.register`` (the scheme class) and
``register_module(name, module)`` (its numpy_ref module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec import HOOKS
from spec.schemes import ModuleRegistry

from .context import Context

__all__ = [
    "LITERAL_FUNCTIONS",
    "NO_SCHEME",
    "REGISTRY",
    "VECTOR_FUNCTIONS",
    "Bound",
    "Context",
    "bind",
    "module_for",
    "register_module",
]

#: scheme name -> its numpy_ref module (a dotted module path, imported on first use, or a module object).
REGISTRY = ModuleRegistry(
    "numpy_ref",
    {
        "shaw": "numpy_ref.schemes.shaw",
        "huang": "numpy_ref.schemes.huang",
        "rope": "numpy_ref.schemes.rope",
        "alibi": "numpy_ref.schemes.alibi",
        "t5": "numpy_ref.schemes.t5",
        "swin": "numpy_ref.schemes.swin",
    },
)

#: The functions a module must define for each hook kind its scheme uses (REL-3).
VECTOR_FUNCTIONS = {kind: (kind, kind + "_vjp") for kind in HOOKS}
LITERAL_FUNCTIONS = {
    "qk_transform": ("literal_q", "literal_k"),
    "key_term": ("literal_key_term",),
    "key_side_term": ("literal_key_side_term",),
    "bias": ("literal_bias",),
    "value_term": ("literal_value_row",),
}


register_module = REGISTRY.register_module
module_for = REGISTRY.module_for


@dataclass(frozen=True)
class Bound:
    """A scheme with its module: the hooks one call applies, in HOOKS order (REL-3).

    ``Bound(None, None, ())`` stands for ``relative=None``: it uses no hook.
    """

    scheme: Any | None
    module: Any | None
    kinds: tuple  # the hook kinds this configuration uses, in HOOKS order

    def uses(self, kind: str) -> bool:
        """Whether this configuration contributes through hook ``kind`` (REL-3)."""
        return kind in self.kinds

    def call(self, function: str, *args):
        """``module.function(scheme, *args)`` (REL-3)."""
        return getattr(self.module, function)(self.scheme, *args)


NO_SCHEME = Bound(None, None, ())


def bind(scheme, *, literal: bool = False) -> Bound:
    """The hooks of ``scheme`` (None: no hooks), checked against its module (REL-3).

    Every hook kind in ``scheme.hooks`` must be one of ``spec.HOOKS`` and the
    module must define its functions (``VECTOR_FUNCTIONS``, or with
    ``literal`` the ``LITERAL_FUNCTIONS`` of the loop-level definition).
    """
    if scheme is None:
        return NO_SCHEME
    module = module_for(scheme)
    unknown = sorted(set(scheme.hooks) - set(HOOKS))
    if unknown:
        raise ValueError(f"{scheme.name}.hooks: expected hook kinds from {HOOKS} [REL-3], got {unknown}")
    kinds = tuple(kind for kind in HOOKS if kind in scheme.hooks)
    needed = LITERAL_FUNCTIONS if literal else VECTOR_FUNCTIONS
    missing = [f for kind in kinds for f in needed[kind] if not callable(getattr(module, f, None))]
    if missing:
        raise ValueError(
            f"{_module_name(module)}: expected the functions {missing} for the hooks {list(kinds)} "
            f"of scheme {scheme.name!r} [REL-3], got a module without them"
        )
    return Bound(scheme, module, kinds)


def _module_name(module) -> str:
    return module if isinstance(module, str) else getattr(module, "__name__", repr(module))
