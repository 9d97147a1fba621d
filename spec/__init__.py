"""attnspec's shared vocabulary: the spec objects, the profiles, the version.

The normative text lives beside this file (``spec/*.md``); every rule there
has a stable id such as ``MASK-5``. ``rule_ids()`` lists them as written.
No numerics live in this package.
"""

from __future__ import annotations

import re
from importlib import resources

from . import profiles
from .biases import Alibi, Swin, T5Bias, alibi_slopes, swin_positions, t5_bucket
from .core import SPEC_VERSION, AttentionSpec
from .huang import Huang
from .rope import Rope, dynamic_ntk_alpha, rope_permutation
from .schemes import HOOKS, Scheme, register, scheme_classes, scheme_from_json, unregister
from .shaw import Shaw

__all__ = [
    "AttentionSpec",
    "Shaw",
    "Huang",
    "Rope",
    "Alibi",
    "T5Bias",
    "Swin",
    "alibi_slopes",
    "t5_bucket",
    "swin_positions",
    "rope_permutation",
    "dynamic_ntk_alpha",
    "Scheme",
    "HOOKS",
    "register",
    "unregister",
    "scheme_classes",
    "scheme_from_json",
    "profiles",
    "SPEC_VERSION",
    "rule_ids",
]

# A rule is declared in the text as a bold id at the start of a line: **MASK-5**
_RULE_DECL = re.compile(r"^\*\*([A-Z][A-Z0-9]*-\d+)\*\*", re.MULTILINE)


def rule_ids() -> list[str]:
    """Every rule id declared in the normative text, in document order."""
    ids: list[str] = []
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".md"):
            ids.extend(_RULE_DECL.findall(entry.read_text(encoding="utf-8")))
    return ids
