"""The hook interface between the naive core and one position scheme (REL-3), and its registry.

A position scheme adds to attention through at most five hook kinds
(``spec.HOOKS``, in the order the core applies them). For each kind a scheme
uses (``scheme.hooks``), its naive module supplies the methods below; the
core calls nothing else, and never looks at the scheme's type. Every method
gets the spec's scheme object (the frozen dataclass, e.g. ``spec.Shaw``)
first. Axis legend: B batch, H heads, Lq query length, Lk key length, d head
dim, R table rows; ``delta`` is the key-minus-query distance (1|B, Lq, Lk)
(POS-2), positions are (1|B, L) integers.

- ``qk_transform`` (RoPE): ``qk_transform(scheme, P, q, k, q_positions,
  k_positions) -> (q, k)`` on the projected heads (B, H, Lq|Lk, d), before
  any scaling, rounded by the hook with ``P``; ``qk_transform_vjp(scheme, P,
  dq, dk, q_positions, k_positions) -> (dq, dk)``, its transpose.
- ``key_term`` (Shaw keys, Huang): ``key_index(scheme, delta) -> (index,
  valid)``: the row of ``rel_k`` that logit (b, i, j) adds ``q_i . rel_k[row]``
  from, (1|B, Lq, Lk) int in [0, R), and where that term exists, (1|B, Lq,
  Lk) bool, or None for everywhere. The core does the matmul, the gather,
  the scaling (SCALE-3) and the VJP.
- ``key_side_term`` (Shaw's key side): ``key_side_index(scheme, delta) ->
  (table, index)``: the name of the table and the row that logit (b, i, j)
  adds ``k_j . table[row]`` from, (1|B, Lq, Lk) int in [0, R). The core does
  the matmul, the gather per key, the factor (SHAW-7) and the VJP.
- ``bias`` (ALiBi, T5, Swin): ``bias(scheme, P, params, num_heads,
  q_positions, k_positions, delta) -> term``, a query-independent logit
  term broadcastable to (B, H, Lq, Lk) (H = num_heads), rounded by the
  hook; ``bias_vjp(scheme, P, params, num_heads, q_positions, k_positions,
  delta, grad) -> {table: gradient}`` from the logits' gradient grad (B, H, Lq, Lk).
- ``value_term`` (Shaw values, Huang values): ``value_index(scheme, delta) ->
  (index, valid)``: the row of ``rel_v`` that weight (b, h, i, j) adds into,
  (1|B, Lq, Lk) int in [0, R), and where that pair adds anything, (1|B, Lq,
  Lk) bool, or None for everywhere. The core does the bucket sum, the matmul
  and the VJP.

Add a scheme by one module in this folder, named after ``scheme.name``, that
subclasses ``NaiveScheme``, is decorated with ``@register`` and is imported
in ``schemes/__init__.py``.
"""

from __future__ import annotations

from typing import ClassVar

_REGISTRY: dict[str, "NaiveScheme"] = {}


class NaiveScheme:
    """One scheme's hooks for the naive core; a subclass implements the hooks its scheme uses."""

    name: ClassVar[str] = ""  # the spec scheme's ``name``, the registry key

    def _missing(self, hook: str):
        return NotImplementedError(f"naive emulation: scheme {self.name!r} does not implement the {hook} hook")

    def qk_transform(self, scheme, P, q, k, q_positions, k_positions):
        raise self._missing("qk_transform")

    def qk_transform_vjp(self, scheme, P, dq, dk, q_positions, k_positions):
        raise self._missing("qk_transform")

    def key_index(self, scheme, delta):
        raise self._missing("key_term")

    def key_side_index(self, scheme, delta):
        raise self._missing("key_side_term")

    def bias(self, scheme, P, params, num_heads, q_positions, k_positions, delta):
        raise self._missing("bias")

    def bias_vjp(self, scheme, P, params, num_heads, q_positions, k_positions, delta, grad):
        raise self._missing("bias")

    def value_index(self, scheme, delta):
        raise self._missing("value_term")


def register(cls: type) -> type:
    """Class decorator: register one instance of a ``NaiveScheme`` subclass under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, NaiveScheme) and cls.name):
        raise TypeError(f"register: expected a NaiveScheme subclass with a name, got {cls!r}")
    other = _REGISTRY.get(cls.name)
    if other is not None and type(other) is not cls:
        raise ValueError(f"register: naive scheme name {cls.name!r} is taken by {type(other).__name__}")
    _REGISTRY[cls.name] = cls()
    return cls


def registered() -> list[str]:
    """The scheme names with a naive module, sorted."""
    return sorted(_REGISTRY)


def hooks_for(scheme) -> NaiveScheme:
    """The naive module of ``scheme`` (a spec scheme object), found by ``scheme.name``."""
    name = getattr(scheme, "name", None)
    if name not in _REGISTRY:
        raise ValueError(
            f"naive emulation: expected a scheme with a naive module ({', '.join(registered())}), "
            f"got scheme name {name!r} ({type(scheme).__name__})"
        )
    return _REGISTRY[name]
