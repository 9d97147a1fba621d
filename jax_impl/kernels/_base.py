"""What a kernel is (KERN-1): a frozen description of *how* to compute, that says what it cannot compute.

Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv key/value heads (HEAD-3), dv the
value head dim (HEAD-4); "(1|B, ...)" is an axis of size 1 or B.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Optional

from spec import AttentionSpec


class Call(NamedTuple):
    """The static facts of one call (known at trace time) that a kernel's support may depend on."""

    B: int
    Lq: int
    Lk: int
    default_positions: bool  # q_positions and k_positions both None (POS-3: top-left, delta_ij = j - i)
    mask: bool  # a mask came (MASK-1)
    bias: bool  # a bias came (BIAS-1)
    dropout_keep: bool  # a keep mask came (DROP-1)
    return_weights: bool

    @classmethod
    def of(
        cls,
        query,
        key=None,
        *,
        mask=None,
        bias=None,
        q_positions=None,
        k_positions=None,
        dropout_keep=None,
        return_weights=False,
    ) -> "Call":
        """The facts of a call with these arguments (arrays of any framework: only shapes and presence count)."""
        return cls(
            query.shape[0],
            query.shape[1],
            (query if key is None else key).shape[1],
            default_positions=q_positions is None and k_positions is None,
            mask=mask is not None,
            bias=bias is not None,
            dropout_keep=dropout_keep is not None,
            return_weights=return_weights,
        )


class Inputs(NamedTuple):
    """The arrays a kernel works on: after MASK-7, the projections and the head split."""

    q: Any  # (B, H, Lq, d)
    k: Any  # (B, Hkv, Lk, d): query head h reads key head h // G (HEAD-3)
    v: Any  # (B, Hkv, Lk, dv) (HEAD-3, HEAD-4)
    q_positions: Any  # (1|B, Lq) int (POS-1), or None without causal rule, window and scheme
    k_positions: Any  # (1|B, Lk) int, likewise
    delta: Any  # (1|B, Lq, Lk) int, k_pos - q_pos (POS-2), likewise
    allowed: Any  # bool broadcastable to (B, H, Lq, Lk) (MASK-4), or None: every key allowed
    bias: Any  # the bias input, broadcastable to (B, H, Lq, Lk) (BIAS-1), or None
    dropout_keep: Any  # bool (B, H, Lq, Lk) (DROP-1), or None


class Kernel:
    """The base of the kernels: a frozen dataclass per kernel, its tuning knobs as fields (KERN-1).

    A kernel computes the function the rules define, for every call it
    supports; ``unsupported`` says which (the automatic choice asks the same
    question). Instances are hashable, so ``implementation=`` can be a
    static argument of ``jax.jit``.

    Class attribute ``name``: the kernel's name for ``implementation=``.
    """

    name: ClassVar[str] = ""

    def unsupported(self, spec: AttentionSpec, call: Call) -> Optional[str]:
        """None when this kernel computes ``call`` under ``spec``, else the reason (KERN-1)."""
        raise NotImplementedError

    def __call__(self, spec: AttentionSpec, params: dict, x: Inputs, call: Call):
        """(o (B, H, Lq, dv) in the query's dtype, weights (B, H, Lq, Lk) post-softmax, pre-dropout)."""
        raise NotImplementedError
