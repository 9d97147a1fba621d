"""``"flex"``: PyTorch's FlexAttention, every logit term written as one ``score_mod`` (KERN-1).

FlexAttention computes ``softmax(score_mod(s * q @ k.T)) @ v`` and calls
``score_mod(score, b, h, q_idx, kv_idx)`` per (batch, head, query, key)
with 0-d tensors; it never hands the logits to Python code. Every term of
the spec that is a function of one pair goes there, in the spec's order:

    score  = s * q . k                                   (SCALE-2, HEAD-3: ``enable_gqa``)
           + key_term(b, h, i, j)                        (REL-1, SCALE-3: Shaw, Huang keys)
           + key_side_term(b, h, i, j)                   (SHAW-6, SHAW-7: Shaw's key side)
    score  = cap(score)                                  (SOFTCAP-1)
           + scheme_bias(b, h, i, j) + bias[b, h, i, j]  (REL-3 (3): ALiBi, T5, Swin; SCALE-4, BIAS-1)
    logit  = score where allowed[b, h, i, j], else -inf (MASK-4, MASK-5) or mask_fill (MASK-6)

The scheme's part comes from its score hooks (``score_state`` once per
call, ``score_term`` per pair; the protocol is in ``torch_impl.schemes``):
a key term reads its (B, H, Lq, R) table logits at the row of the pair's
distance, a key-side term its (B, H, Lk, R) ones (``key_side_score_state``,
``key_side_score_term``), a bias computes slope times distance or reads ``rel_b`` at the
pair's row. Nothing of shape (Lq, Lk) is built for a scheme: the
distances come from the positions inside ``score_mod``. The ``mask`` and
``bias`` inputs and the causal and window rules are read from their own
broadcast tensors (``call.allowed``). FlexAttention gives a row with no
allowed key exact zeros (MASK-5) and keeps the logits and the softmax in
float32 for float16 and bfloat16 inputs (PREC-4).

The weights never leave the kernel, yet Shaw's value term (SHAW-4) is a
sum of weights per table row, and FlexAttention returns each row's
log-sum-exp ``lse``. At default positions every distance inside the clip
has one key per query: its weight is recomputed as ``exp(score - lse)``
from the same ``score_mod`` on a band of 2k - 1 gathered keys (a strided
view, nothing copied). The clipped rows take the rest: under a causal rule
the right edge has no allowed key and the left one is 1 minus the band;
otherwise one more FlexAttention call, restricted to the distances left of
the band, gives the left edge's log-sum-exp and the right edge is 1 minus
the others (a row with no allowed key gets 0 everywhere, MASK-5). The
scheme says which distances own a row (``value_distances``); a scheme
without it (Huang's values) has no value term here, nor do explicit
positions. Every logit of a row is first shifted by its largest allowed band
logit (the same softmax), so the log-sum-exp is near 0 and its rounding
costs the recomputed weights nothing. The compiled kernel returns no
log-sum-exp on the CPU (PyTorch 2.13): the value term needs
``Flex(compiled=False)`` there. It takes no given keep mask (DROP-1) and
returns no weights. PyTorch 2.13 has no
FlexAttention backward on the CPU: there it runs forward calls only (a
call that records gradients raises PyTorch's ``NotImplementedError``).

``Flex(compiled=True)`` (the default) calls ``torch.compile(flex_attention)``,
the fused kernel (one compilation per shape, dtype and scheme, then cached
by PyTorch); ``Flex(compiled=False)`` calls FlexAttention eagerly, which
writes the (B, H, Lq, Lk) scores: the same function, no compilation.
Axis legend (AXES-1): B, H, Lq, Lk, d; Hkv (HEAD-3); dv (HEAD-4).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch

from spec._fields import require_bool

from .. import _core, schemes
from ._base import Kernel, transform_qk


@dataclass(frozen=True)
class Flex(Kernel):
    """FlexAttention with the spec's logit terms as its score_mod and Shaw's value term from its log-sum-exp;
    no keep mask or weights (KERN-1).

    Fields:
      compiled: run ``torch.compile(flex_attention)`` (True) or FlexAttention eagerly (False).
    """

    name: ClassVar[str] = "flex"
    scheme_hooks: ClassVar[frozenset] = frozenset({"qk_transform", "key_term", "key_side_term", "bias", "value_term"})

    compiled: bool = True

    def __post_init__(self):
        require_bool("Flex", "compiled", self.compiled)

    def unsupported(self, spec, call) -> Optional[str]:
        reasons = [
            r
            for r in (
                self.missing_hooks(spec),
                self._value_term_unsupported(spec, call) or self._lse_unsupported(spec, call),
                None if call.dropout_keep is None else "flex takes no dropout_keep mask (DROP-1)",
                "flex does not return the weights (return_weights=True)" if call.return_weights else None,
            )
            if r is not None
        ]
        return "; ".join(reasons) or None

    def _lse_unsupported(self, spec, call) -> Optional[str]:
        """The value term reads FlexAttention's log-sum-exp, which the compiled kernel does not return for
        tensors on a CPU (PyTorch 2.13: torch.compile fails inside Inductor): refused before compiling."""
        scheme = spec.relative
        if not self.compiled or call.device.type != "cpu" or scheme is None or "value_term" not in scheme.hooks:
            return None
        return (
            "compiled FlexAttention returns no log-sum-exp for CPU tensors (PyTorch 2.13), which the value term "
            "needs: pass implementation=torch_impl.kernels.Flex(compiled=False) to run it eagerly"
        )

    @staticmethod
    def _value_term_unsupported(spec, call) -> Optional[str]:
        scheme = spec.relative
        if scheme is None or "value_term" not in scheme.hooks:
            return None
        if not hasattr(schemes.module_for(scheme), "value_distances"):
            return (
                f"flex computes a value term from FlexAttention's log-sum-exp only where each distance owns one "
                f"key per query and one row (Shaw); {type(scheme).__name__}'s value term has no such form here"
            )
        if not call.default_positions:
            return "flex computes the value term at default positions only (one key per query and distance)"
        return None


@functools.cache
def _flex_attention(compiled: bool):
    """FlexAttention, compiled once per process or eager (whose advice to compile is not repeated per call)."""
    from torch.nn.attention.flex_attention import flex_attention

    if compiled:
        return torch.compile(flex_attention, dynamic=False)

    def eager(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(*args, **kwargs)

    return eager


def _LSE():
    """FlexAttention's request for the log-sum-exp of each query row (B, H, Lq), beside the output."""
    from torch.nn.attention.flex_attention import AuxRequest

    return AuxRequest(lse=True)


def _reader(t: Optional[torch.Tensor], B: int, H: int, Lq: int, Lk: int):
    """A (1|B, 1|H, Lq, Lk)-broadcastable tensor as a function of one pair, or None for None."""
    if t is None:
        return None
    full = _core.as_4d(t).expand(B, H, Lq, Lk)  # a view: broadcast axes have stride 0
    return lambda b, h, i, j: full[b, h, i, j]


def score_mod_for(spec, params: dict, q, k, call: _core.Call, stat: torch.dtype):
    """Every per-pair logit term of the spec as one FlexAttention ``score_mod(score, b, h, i, j)`` (the module
    docstring's order): q (B, H, Lq, d) and k (B, Hkv, Lk, d) after the q/k transform, ``call`` the call whose
    positions, mask, bias and rules ``i`` and ``j`` index (its Lq and Lk: the keys FlexAttention is given, which
    may be more than ``k`` holds, as under context parallelism); logits in ``stat`` (PREC-4).

    Implements REL-1, REL-3 (3), SCALE-3, SCALE-4, SHAW-6, SHAW-7, SOFTCAP-1, MASK-4..6, BIAS-1, CAUSAL-1, WINDOW-1.
    """
    B, H = q.shape[:2]
    Lq, Lk = call.Lq, call.Lk
    scheme = spec.relative
    hooks = frozenset() if scheme is None else scheme.hooks
    unit = None if scheme is None else schemes.module_for(scheme)
    key_state = side_state = bias_state = None
    if "key_term" in hooks:  # the queries as the key term sees them, s_rel folded in (SCALE-3)
        key_state = unit.score_state(scheme, params, q * spec.relative_scale, call, stat=stat)
    if "key_side_term" in hooks:  # SHAW-6: the keys as the key-side term sees them, its factor folded in (SHAW-7)
        side_state = unit.key_side_score_state(
            scheme, params, k * spec.key_side_scale, call, group=spec.group_size, stat=stat
        )
    if "bias" in hooks:
        bias_state = unit.score_state(scheme, params, q, call, stat=stat)
    bias = _reader(None if call.bias is None else call.bias.to(stat), B, H, Lq, Lk)
    allowed = _reader(call.allowed, B, H, Lq, Lk)
    fill = float("-inf") if spec.mask_fill is None else spec.mask_fill
    cap = spec.softcap

    def score_mod(score, b, h, i, j):
        if key_state is not None:  # REL-1, SCALE-3
            score = score + unit.score_term(key_state, b, h, i, j)
        if side_state is not None:  # SHAW-6, SHAW-7
            score = score + unit.key_side_score_term(side_state, b, h, i, j)
        score = _core.softcap(score, cap)  # SOFTCAP-1: before the biases and the masks
        if bias_state is not None:  # REL-3 (3), SCALE-4: unscaled
            score = score + unit.score_term(bias_state, b, h, i, j)
        if bias is not None:  # BIAS-1
            score = score + bias(b, h, i, j)
        if allowed is not None:  # MASK-4..6: the causal rule, the window, the mask, -inf in the bias
            score = torch.where(allowed(b, h, i, j), score, fill)
        return score

    return score_mod


def attention(kernel: Flex, spec, params: dict, q, k, v, call: _core.Call) -> torch.Tensor:
    """q (B, H, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv) -> o (B, H, Lq, dv).

    Implements REL-1, REL-3 (1), REL-3 (3), SHAW-4, SCALE-2..4, SOFTCAP-1, MASK-4..6, BIAS-1, BIAS-2, CAUSAL-1,
    WINDOW-1, HEAD-3, HEAD-4, PREC-4.
    """
    q, k = transform_qk(spec, params, q, k, call)  # REL-3 (1): before the kernel
    H = q.shape[1]
    stat = _core.stat_dtype(q.dtype)  # PREC-4: FlexAttention's logits for 16-bit inputs are float32 too
    scheme = spec.relative
    score_mod = score_mod_for(spec, params, q, k, call, stat)
    flex = _flex_attention(kernel.compiled)
    gqa = k.shape[1] != H
    if scheme is None or "value_term" not in scheme.hooks:
        return flex(q, k, v, score_mod=score_mod, scale=spec.effective_scale, enable_gqa=gqa)
    band = _band(spec, schemes.module_for(scheme).value_distances(scheme), q, k, score_mod, stat, call.allowed)
    # every logit of a row less one number near its largest (a band score): the same softmax, and a
    # log-sum-exp near 0 whose rounding costs the recomputed weights nothing (logits of 1e3 lose 6e-5 in float32)
    shift = band.shift

    def shifted(score, b, h, i, j):
        return score_mod(score, b, h, i, j) - shift[b, h, i]

    o, aux = flex(q, k, v, score_mod=shifted, scale=spec.effective_scale, enable_gqa=gqa, return_aux=_LSE())
    buckets = _value_buckets(
        spec,
        band,
        aux.lse,
        lambda mod: flex(q, k, v, score_mod=mod, scale=spec.effective_scale, enable_gqa=gqa, return_aux=_LSE())[1].lse,
        shifted,
    )
    table = params["rel_v"].to(stat)  # (R, dv) | (H, R, dv), REL-2, HEAD-4
    term = buckets @ table  # (B, H, Lq, R) @ (R, dv) | (H, R, dv): matmul broadcasts either over (B, H)
    return (o.to(stat) + term).to(o.dtype)  # SHAW-4: added to the weighted values, one rounding


class _Band(NamedTuple):
    """The value term's band at default positions (``value_distances``): one key per query and distance."""

    lo: int  # the first distance of the band
    hi: int  # its last
    edges: bool  # rows 0 and R - 1 take the distances < lo and > hi
    score: torch.Tensor  # (B, H, Lq, n) every logit term of key j = i + lo + t, shifted by ``shift``
    inside: torch.Tensor  # (1, 1, Lq, n) bool: key j exists (0 <= j < Lk)
    shift: torch.Tensor  # (B, H, Lq) the largest finite band logit of the row, 0 where none (no gradient)


def _band(spec, distances: tuple, q, k, score_mod, stat, allowed) -> _Band:
    """The band's logits s q_i . k_j through ``score_mod`` (every other term, the masks), k a strided view of
    itself padded at both ends (nothing copied, nothing of shape (Lq, n, d) built); ``allowed`` the call's
    allowed keys (MASK-4) or None. The value term's weights are these logits' (SHAW-4), shifted by a number
    per row that the masks and ``mask_fill`` decide (MASK-5, MASK-6)."""
    lo, hi, edges = distances
    B, H, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    n = max(hi - lo + 1, 0)
    i = torch.arange(Lq, device=q.device).view(1, 1, Lq, 1)
    j = i + torch.arange(lo, lo + n, device=q.device)
    inside = (j >= 0) & (j < Lk)
    if not n:
        score = q.new_zeros((B, H, Lq, 0), dtype=stat)
        return _Band(lo, hi, edges, score, inside, q.new_zeros((B, H, Lq), dtype=stat))
    pad_left, pad_right = -lo, max(0, Lq + hi - Lk)  # padded, key i + lo + t is row i + t
    windows = torch.nn.functional.pad(k, (0, 0, pad_left, pad_right)).unfold(2, n, 1)[:, :, :Lq]  # (B,Hkv,Lq,d,n)
    qg = q.view(B, Hkv, H // Hkv, Lq, d)  # HEAD-3: query head h reads key head h // G
    score = torch.einsum("bkgid,bkidn->bkgin", qg.to(stat), windows.to(stat)).reshape(B, H, Lq, n)
    b = torch.arange(B, device=q.device).view(B, 1, 1, 1)
    h = torch.arange(H, device=q.device).view(1, H, 1, 1)
    score = score_mod(score * spec.effective_scale, b, h, i, j.clamp(0, Lk - 1))
    score = torch.where(inside, score, float("-inf"))
    # The shift: the largest logit of an allowed band key; a mask_fill logit (MASK-6) far below the row's own
    # would leave them huge after it. A row with no allowed key at all (its logits all mask_fill) takes the
    # fill, so its uniform weights come out exact; any other row without an allowed band key takes 0.
    zero = torch.zeros((), dtype=stat, device=q.device)
    scores = score.detach()
    if spec.mask_fill is None:
        shift = scores.amax(-1)
        shift = torch.where(torch.isfinite(shift), shift, zero)
    else:
        top = torch.where(scores == spec.mask_fill, float("-inf"), scores).amax(-1)
        empty = torch.zeros_like(top, dtype=torch.bool) if allowed is None else ~allowed.any(-1)
        shift = torch.where(torch.isfinite(top), top, torch.where(empty, scores.amax(-1), zero))
    return _Band(lo, hi, edges, score - shift.unsqueeze(-1), inside, shift)


def _value_buckets(spec, band: _Band, lse, lse_of, score_mod) -> torch.Tensor:
    """SHAW-4's weight sums per table row, S (B, H, Lq, R), from FlexAttention's log-sum-exp ``lse`` (B, H, Lq)
    of the shifted logits: the band's weights exp(score - lse); the edges as the module docstring says, with
    ``lse_of(score_mod)`` the log-sum-exp of one more FlexAttention call."""
    alive = torch.isfinite(lse)  # MASK-5: a row with no allowed key weighs nothing
    zero = torch.zeros((), dtype=band.score.dtype, device=lse.device)
    lse0 = torch.where(alive, lse.to(band.score.dtype), zero)
    w = torch.where(band.inside & alive.unsqueeze(-1), torch.exp(band.score - lse0.unsqueeze(-1)), zero)
    if not band.edges:
        return w
    rest = alive.to(w.dtype) - w.sum(-1)
    if spec.causal and spec.mask_fill is None and band.hi >= 0:  # CAUSAL-1: no key right of the band
        left, right = rest, torch.zeros_like(rest)
    else:  # only the distances left of the band
        lo = band.lo
        lse_left = lse_of(
            lambda score, b, h, i, j: torch.where(j - i < lo, score_mod(score, b, h, i, j), float("-inf"))
        )
        left = torch.where(torch.isfinite(lse_left) & alive, torch.exp(lse_left.to(w.dtype) - lse0), zero)
        right = rest - left
    if not w.shape[-1]:  # k = 0: both edges are the one row
        return (left + right).unsqueeze(-1)
    return torch.cat([left.unsqueeze(-1), w, right.unsqueeze(-1)], dim=-1)  # rows 0, 1 .. R - 2, R - 1
