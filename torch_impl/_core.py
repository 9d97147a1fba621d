"""What every kernel shares: the call's description, positions, allowed keys, the softmax, the head layout.

Axis legend (AXES-1): B batch, H heads, Lq query length, Lk key length,
D model dim (= H * d), d head dim; Hkv key/value heads and G = H / Hkv the
query heads per key/value head (HEAD-3), dv value head dim (HEAD-4). Each
piece exists once here; the kernels (``torch_impl.kernels``) and the
schemes (``torch_impl.schemes``) call it.
Tensors are created on the device of the tensors they come from.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- head layout
def project(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """PROJ-1 / OUT-1: x @ W + b, W stored (in, out); one fused multiply-add (addmm) with the bias."""
    return F.linear(x, w.t(), b)


def split_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """HEAD-1: (B, L, H * c) -> (B, H, L, c), feature f to head f // c, channel f % c.

    Queries: H heads of d; keys: Hkv heads of d; values: Hkv heads of dv (HEAD-3, HEAD-4).
    """
    B, L, _ = x.shape
    return x.view(B, L, H, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """HEAD-2: (B, H, L, dv) -> (B, L, H * dv), the exact inverse of ``split_heads``."""
    B, H, L, c = x.shape
    return x.transpose(1, 2).reshape(B, L, H * c)


def grouped_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q @ k.T per query head, query head h reading key head h // G (HEAD-3): (B, H, Lq, d), (B, Hkv, Lk, d)
    -> (B, H, Lq, Lk).

    The G query heads of a group are stacked as (B, Hkv, G * Lq, d), one
    matmul per key/value head: no key is repeated. With G = 1 it is q @ k.T.
    """
    B, H, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    return (q.reshape(B, Hkv, (H // Hkv) * Lq, d) @ k.transpose(-1, -2)).view(B, H, Lq, Lk)


def grouped_values(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w @ v per query head, query head h reading value head h // G (HEAD-3, HEAD-4): (B, H, Lq, Lk),
    (B, Hkv, Lk, dv) -> (B, H, Lq, dv); the adjoint sums a value head's gradient over its group."""
    B, H, Lq, Lk = w.shape
    Hkv, dv = v.shape[1], v.shape[3]
    return (w.reshape(B, Hkv, (H // Hkv) * Lq, Lk) @ v).view(B, H, Lq, dv)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """PREC-4: the dtype of the logits and the softmax statistics: float32 for the 16-bit dtypes."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """A tensor broadcastable to (B, H, Lq, Lk) (MASK-1, BIAS-1) with its missing leading axes as size 1."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


# ---------------------------------------------------------------- the call
@dataclass(frozen=True, eq=False)
class Call:
    """One attention call after the checks (INPUT-1), as the kernels see it (KERN-1).

    Sizes B, Lq, Lk and the call's optional inputs exactly as passed: ``mask``
    bool broadcastable to (B, H, Lq, Lk) (MASK-1), ``bias`` float likewise
    (BIAS-1), ``q_positions`` (Lq,) | (B, Lq) and ``k_positions`` (Lk,) |
    (B, Lk) (POS-1), ``dropout_keep`` bool (B, H, Lq, Lk) (DROP-2).
    ``causal`` is ``spec.causal``, ``window`` is ``spec.window`` (WINDOW-1).
    ``delta`` and ``allowed`` are computed on first use, once per call, so a
    kernel that never reads them never pays.
    (A memo in the instance dict rather than ``functools.cached_property``,
    which takes a lock on every read before Python 3.12.)
    """

    B: int
    Lq: int
    Lk: int
    device: torch.device
    mask: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    q_positions: Optional[torch.Tensor] = None
    k_positions: Optional[torch.Tensor] = None
    dropout_keep: Optional[torch.Tensor] = None
    return_weights: bool = False
    causal: bool = False
    window: Optional[tuple] = None
    dtype: Optional[torch.dtype] = None  # the query's dtype (a kernel may not compute every dtype)
    requires_grad: bool = False  # autograd records the call (a kernel without a backward refuses it)

    @property
    def default_positions(self) -> bool:
        """POS-1: neither positions given, so delta[i, j] = j - i (top-left)."""
        return self.q_positions is None and self.k_positions is None

    @property
    def delta(self) -> torch.Tensor:
        """POS-2: delta[b, i, j] = k_pos[b, j] - q_pos[b, i], int64 (1|B, Lq, Lk)."""
        memo = self.__dict__
        if "_delta" not in memo:
            q_pos = positions(self.q_positions, self.Lq, self.device)
            k_pos = positions(self.k_positions, self.Lk, self.device)
            memo["_delta"] = k_pos.unsqueeze(1) - q_pos.unsqueeze(2)
        return memo["_delta"]

    @property
    def allowed(self) -> Optional[torch.Tensor]:
        """MASK-4: the allowed keys at their broadcast shape, or None when every key is allowed."""
        memo = self.__dict__
        if "_allowed" not in memo:
            by_distance = self.causal or self.window is not None  # only then is delta needed
            memo["_allowed"] = allowed_keys(
                self.delta if by_distance else None, self.mask, self.bias, causal=self.causal, window=self.window
            )
        return memo["_allowed"]


def positions(p: Optional[torch.Tensor], L: int, device) -> torch.Tensor:
    """POS-1: (1|B, L) int64 positions, default arange(L)."""
    if p is None:
        return torch.arange(L, device=device).unsqueeze(0)
    p = p.to(torch.int64)
    return p.unsqueeze(0) if p.dim() == 1 else p


# ---------------------------------------------------------------- allowed keys and the softmax
def allowed_keys(
    delta: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    *,
    causal: bool = False,
    window: Optional[tuple] = None,
) -> Optional[torch.Tensor]:
    """MASK-4: mask AND causal AND in the window AND bias != -inf (MASK-2, BIAS-2), at the broadcast shape;
    None when all allowed.

    ``delta`` (1|B, Lq, Lk), needed with ``causal`` or ``window`` only: key j
    is allowed for query i iff delta[i, j] <= 0 under ``causal`` (CAUSAL-1),
    and iff -left <= delta[i, j] <= right under ``window = (left, right)``, a
    None side unbounded (WINDOW-1).
    """
    parts = []
    if causal:
        parts.append((delta <= 0).unsqueeze(1))  # CAUSAL-1, (1|B, 1, Lq, Lk)
    if window is not None:  # WINDOW-1
        left, right = window
        if left is not None:
            parts.append((delta >= -left).unsqueeze(1))
        if right is not None:
            parts.append((delta <= right).unsqueeze(1))
    if mask is not None:
        parts.append(mask)  # MASK-2: combined by AND
    if bias is not None:
        parts.append(bias != float("-inf"))  # BIAS-2
    return functools.reduce(operator.and_, parts) if parts else None


def dead_keys(allowed: torch.Tensor, B: int, Lk: int) -> torch.Tensor:
    """MASK-7: keys that no query of any head may attend (none of whose MASK-4 entries is allowed), (B, Lk) bool."""
    return ~as_4d(allowed).any(dim=2).any(dim=1).expand(B, Lk)


def masked_softmax(
    logits: torch.Tensor,
    allowed: Optional[torch.Tensor],
    mask_fill: Optional[float],
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SOFTMAX-1 over the keys, with MASK-5 (``mask_fill`` None) or MASK-6 (a float).

    logits (..., Lq, Lk); ``allowed`` broadcastable to them, or None when
    every key is allowed (then the plain softmax, written to ``out`` when
    given). MASK-5: a disallowed key gets weight exactly 0 and a row without
    an allowed key gets all-zero weights, never NaN: the row max of such a
    row is -inf, so it is replaced by 0 before the exponential (exp(-inf) =
    0 at every key) and its zero sum by 1. MASK-6: disallowed logits become
    ``mask_fill`` and the ordinary softmax follows (a fully masked row then
    averages uniformly).
    """
    if allowed is None:
        return torch.softmax(logits, dim=-1) if out is None else torch.softmax(logits, dim=-1, out=out)
    if mask_fill is not None:
        return torch.softmax(logits.masked_fill(~allowed, mask_fill), dim=-1)
    z = logits.masked_fill(~allowed, float("-inf"))
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()  # rows with no allowed key
    e = torch.exp(z - m)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def softcap(score: torch.Tensor, cap: Optional[float], in_place: bool = False) -> torch.Tensor:
    """SOFTCAP-1: cap * tanh(score / cap) of the score (content and relative key term), before the biases,
    the masks and mask_fill; the score itself without a cap (``cap`` None).

    ``in_place``: overwrite ``score`` (only where no gradient is recorded).
    """
    if cap is None:
        return score
    if in_place:
        return score.div_(cap).tanh_().mul_(cap)
    return cap * torch.tanh(score / cap)


def dropout(weights: torch.Tensor, keep: Optional[torch.Tensor], p: float) -> torch.Tensor:
    """DROP-1: w * keep / (1 - p) for a bool keep mask broadcastable to the weights; w without one."""
    return weights if keep is None else weights.masked_fill(~keep, 0.0) / (1.0 - p)
