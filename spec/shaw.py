"""``Shaw``: clipped relative positions of Shaw et al. 2018 (rules SHAW-1..SHAW-5)."""

from __future__ import annotations

from dataclasses import dataclass

from ._fields import require_bool, require_int
from .schemes import Scheme, register


@register
@dataclass(frozen=True)
class Shaw(Scheme):
    """Clipped relative positions of Shaw et al. 2018 (rules SHAW-1..SHAW-5).

    Tables ``rel_k`` and ``rel_v`` have ``2 * max_distance + 1`` rows
    (``(R, d)``, or ``(H, R, d)`` with ``per_head``). The distance
    ``delta = k_pos - q_pos`` selects row ``clip(delta, -k, k) + k``.
    Hooks: a key term (``keys``) and a value term (``values``).
    """

    name = "shaw"
    rule_prefix = "SHAW"

    max_distance: int
    keys: bool = True
    values: bool = True
    per_head: bool = False

    def __post_init__(self):
        object.__setattr__(self, "max_distance", require_int("Shaw", "max_distance", self.max_distance, 0))
        require_bool("Shaw", "keys", self.keys)
        require_bool("Shaw", "values", self.values)
        require_bool("Shaw", "per_head", self.per_head)
        if not (self.keys or self.values):
            raise ValueError(
                "Shaw: expected keys=True or values=True (a scheme with neither term "
                "adds nothing; use relative=None), got keys=False, values=False"
            )

    @property
    def num_rows(self) -> int:
        """R = 2k + 1, the number of table rows (one per clipped distance)."""
        return 2 * self.max_distance + 1

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """SHAW-1: ``rel_k`` (keys) ``(R, d)`` or ``(H, R, d)``, and ``rel_v`` (values) ``(R, dv)`` or
        ``(H, R, dv)`` (REL-2, HEAD-4)."""
        lead = (num_heads,) if self.per_head else ()
        return {
            **({"rel_k": (*lead, self.num_rows, head_dim)} if self.keys else {}),
            **({"rel_v": (*lead, self.num_rows, value_head_dim)} if self.values else {}),
        }

    @property
    def hooks(self) -> frozenset:
        return frozenset({"key_term"} if self.keys else set()) | frozenset({"value_term"} if self.values else set())

    @property
    def features(self) -> frozenset:
        f = {"shaw"}
        if self.values:
            f.add("shaw-values")
        if self.per_head:
            f.add("per-head-tables")
        return frozenset(f)
