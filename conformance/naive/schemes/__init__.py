"""The naive emulation's position schemes: one module per scheme, found by ``scheme.name`` (REL-3).

``hooks_for(scheme)`` gives the scheme's ``NaiveScheme`` (the hook interface
is described in ``base``); an unknown scheme is a ``ValueError`` naming the
registered ones.
"""

from __future__ import annotations

from . import alibi, huang, rope, shaw, swin, t5  # noqa: F401  (importing registers them)
from .base import NaiveScheme, hooks_for, register, registered

__all__ = ["NaiveScheme", "hooks_for", "register", "registered"]
