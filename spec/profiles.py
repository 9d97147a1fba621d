"""Named configurations that reproduce four widely copied attention programs.

Each function returns the ``AttentionSpec`` under which attnspec computes
exactly what that program computes (rule PROF-1). The spec text
(``spec/profiles.md``) gives, per profile, how the program's parameters map
onto the canonical ones and every place where the program departs from the
default semantics; the docstrings here summarise it.
"""

from __future__ import annotations

import math

from .core import AttentionSpec
from .huang import Huang
from .shaw import Shaw
from .validation import fail_value

__all__ = ["tutorial_mha", "einsum_selfattention", "shaw_rpe", "music_relative"]


def _int_at_least(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail_value(name, f"an int >= {minimum}", repr(value))
    return value


def _head_dim(model_arg: str, model_dim: int, heads_arg: str, heads: int) -> int:
    _int_at_least(model_arg, model_dim, 1)
    _int_at_least(heads_arg, heads, 1)
    if model_dim % heads:
        raise fail_value(model_arg, f"a multiple of {heads_arg} = {heads}", model_dim)
    return model_dim // heads


def tutorial_mha(feature_dim: int, num_heads: int) -> AttentionSpec:
    """The plain multi-head attention walk-through (PROF-2).

    Linear q/k/v/out layers with biases, contiguous head split, scale
    1/sqrt(head_dim), no mask: the default semantics. Parameters: each
    ``nn.Linear`` weight is stored (out, in), so the canonical weight is its
    transpose.
    """
    return AttentionSpec(num_heads=num_heads, head_dim=_head_dim("feature_dim", feature_dim, "num_heads", num_heads))


def einsum_selfattention(embed_size: int, heads: int) -> AttentionSpec:
    """The einsum ``SelfAttention`` module (PROF-3).

    Departures: the logits are scaled by 1/sqrt(embed_size), not
    1/sqrt(head_dim); masked logits are filled with -1e20 *before* that
    scaling, so the filled logit is -1e20/sqrt(embed_size); the per-head
    query/key/value layers it creates are never applied, so the canonical
    wq = wk = wv = identity and bq = bk = bv = 0, and only the output layer
    (with bias) acts. Its ``forward`` takes (values, keys, query, mask).
    """
    d = _head_dim("embed_size", embed_size, "heads", heads)
    root = math.sqrt(embed_size)
    return AttentionSpec(num_heads=heads, head_dim=d, scale=1.0 / root, mask_fill=-1e20 / root)


def shaw_rpe(hid_dim: int, n_heads: int, max_relative_position: int = 2) -> AttentionSpec:
    """The Shaw relative-position attention layer (PROF-4).

    One key table and one value table of 2k+1 rows shared by all heads, the
    relative key term added before the division by sqrt(head_dim) (so it is
    scaled), masked logits (``mask == 0``) filled with -1e10 after scaling.
    Dropout, when the program is built with p > 0, acts on the weights before
    both value terms: ``dataclasses.replace(spec, dropout=p)``.
    """
    d = _head_dim("hid_dim", hid_dim, "n_heads", n_heads)
    _int_at_least("max_relative_position", max_relative_position, 0)
    return AttentionSpec(
        num_heads=n_heads,
        head_dim=d,
        relative=Shaw(max_distance=max_relative_position, keys=True, values=True, per_head=False),
        scale_relative=True,
        mask_fill=-1e10,
    )


def music_relative(d_model: int, nhead: int, seq_len: int) -> AttentionSpec:
    """The relative-position self-attention with the shifted S_rel (PROF-5).

    One table of 2*seq_len - 1 rows shared by heads; the relative logits are
    added *unscaled* to the scaled content logits. Exact only for inputs of
    length seq_len: the program reads table row ``delta + L - 1`` with L the
    input's length, so for shorter inputs its offset moves (see the spec).
    """
    d = _head_dim("d_model", d_model, "nhead", nhead)
    _int_at_least("seq_len", seq_len, 1)
    return AttentionSpec(
        num_heads=nhead,
        head_dim=d,
        relative=Huang(max_len=seq_len, per_head=False),
        scale_relative=False,
    )
