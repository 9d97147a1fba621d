"""``Shaw``: clipped relative positions of Shaw et al. 2018 (rules SHAW-1..SHAW-7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._fields import require_bool, require_int
from .schemes import Scheme, register

#: The key-side terms (SHAW-6): none, one reading ``rel_k``, one reading its own ``rel_q``.
KEY_SIDES = (None, "shared", "own")


@register
@dataclass(frozen=True)
class Shaw(Scheme):
    """Clipped relative positions of Shaw et al. 2018 (rules SHAW-1..SHAW-7).

    Tables ``rel_k`` and ``rel_v`` have ``2 * max_distance + 1`` rows
    (``(R, d)``, or ``(H, R, d)`` with ``per_head``). The distance
    ``delta = k_pos - q_pos`` selects row ``clip(delta, -k, k) + k``.
    Hooks: a key term (``keys``), a key-side term (``key_side``) and a value
    term (``values``).

    ``key_side`` (SHAW-6): None (no term), ``"shared"`` (the key-side term
    reads ``rel_k``: BERT's and ESM's ``relative_key_query``) or ``"own"``
    (it reads its own table ``rel_q``, shaped like ``rel_k``: DeBERTa's
    position-to-content term). ``key_side_scaled`` (SHAW-7): whether that
    term carries the factor s_rel of the key term (True, BERT) or 1 (False, ESM).
    """

    name = "shaw"
    rule_prefix = "SHAW"

    max_distance: int
    keys: bool = True
    values: bool = True
    per_head: bool = False
    key_side: Optional[str] = None
    key_side_scaled: bool = True

    def __post_init__(self):
        object.__setattr__(self, "max_distance", require_int("Shaw", "max_distance", self.max_distance, 0))
        require_bool("Shaw", "keys", self.keys)
        require_bool("Shaw", "values", self.values)
        require_bool("Shaw", "per_head", self.per_head)
        if self.key_side not in KEY_SIDES:
            raise ValueError(f"Shaw.key_side: expected one of {KEY_SIDES} [SHAW-6], got {self.key_side!r}")
        require_bool("Shaw", "key_side_scaled", self.key_side_scaled)
        if not (self.keys or self.values or self.key_side):
            raise ValueError(
                "Shaw: expected keys=True, values=True or a key_side (a scheme with no term "
                "adds nothing; use relative=None), got keys=False, values=False, key_side=None"
            )
        if self.key_side == "shared" and not self.keys:
            raise ValueError(
                "Shaw.key_side: expected keys=True with key_side='shared' (the key-side term reads "
                "rel_k; without keys use key_side='own') [SHAW-6], got keys=False"
            )
        if not self.key_side and not self.key_side_scaled:
            raise ValueError(
                "Shaw.key_side_scaled: expected True without a key_side (it scales the key-side term "
                "only) [SHAW-7], got False with key_side=None"
            )

    @property
    def num_rows(self) -> int:
        """R = 2k + 1, the number of table rows (one per clipped distance)."""
        return 2 * self.max_distance + 1

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """SHAW-1: ``rel_k`` (keys) ``(R, d)`` or ``(H, R, d)``, ``rel_q`` (``key_side="own"``, SHAW-6)
        shaped like it, and ``rel_v`` (values) ``(R, dv)`` or ``(H, R, dv)`` (REL-2, HEAD-4)."""
        lead = (num_heads,) if self.per_head else ()
        return {
            **({"rel_k": (*lead, self.num_rows, head_dim)} if self.keys else {}),
            **({"rel_q": (*lead, self.num_rows, head_dim)} if self.key_side == "own" else {}),
            **({"rel_v": (*lead, self.num_rows, value_head_dim)} if self.values else {}),
        }

    @property
    def hooks(self) -> frozenset:
        kinds = {"key_term"} if self.keys else set()
        if self.key_side:
            kinds.add("key_side_term")
        if self.values:
            kinds.add("value_term")
        return frozenset(kinds)

    @property
    def features(self) -> frozenset:
        f = {"shaw"}
        if self.values:
            f.add("shaw-values")
        if self.per_head:
            f.add("per-head-tables")
        if self.key_side:
            f.add("shaw-key-side")
        return frozenset(f)
