"""``Huang``: unclipped relative key logits of Huang et al. 2018 (rules HUANG-1..HUANG-6)."""

from __future__ import annotations

from dataclasses import dataclass

from ._fields import require_bool, require_int
from .schemes import Scheme, register


@register
@dataclass(frozen=True)
class Huang(Scheme):
    """Unclipped relative key logits of Huang et al. 2018 (rules HUANG-1..HUANG-6).

    Table ``rel_k`` has ``2 * max_len - 1`` rows (``(R, d)``, or ``(H, R, d)``
    with ``per_head``); row ``r`` holds distance ``r - (max_len - 1)``. A
    distance with ``|delta| > max_len - 1`` contributes zero. Hooks: a key
    term, and with ``values`` a value term read from ``rel_v`` (``(R, dv)`` or
    ``(H, R, dv)``) by the same rows, zero beyond the table (HUANG-6:
    tensor2tensor's ``add_relative_to_values``).
    """

    name = "huang"
    rule_prefix = "HUANG"

    max_len: int
    per_head: bool = True
    values: bool = False

    def __post_init__(self):
        object.__setattr__(self, "max_len", require_int("Huang", "max_len", self.max_len, 1))
        require_bool("Huang", "per_head", self.per_head)
        require_bool("Huang", "values", self.values)

    @property
    def num_rows(self) -> int:
        """R = 2M - 1, the number of table rows (distances -(M-1) .. M-1)."""
        return 2 * self.max_len - 1

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """HUANG-1: ``rel_k``, ``(R, d)`` or ``(H, R, d)`` (REL-2); HUANG-6: ``rel_v`` ``(R, dv)`` or
        ``(H, R, dv)`` with ``values`` (HEAD-4)."""
        lead = (num_heads,) if self.per_head else ()
        return {
            "rel_k": (*lead, self.num_rows, head_dim),
            **({"rel_v": (*lead, self.num_rows, value_head_dim)} if self.values else {}),
        }

    @property
    def hooks(self) -> frozenset:
        return frozenset({"key_term", "value_term"} if self.values else {"key_term"})

    @property
    def features(self) -> frozenset:
        f = {"huang", "per-head-tables"} if self.per_head else {"huang"}
        return frozenset(f | {"huang-values"} if self.values else f)
