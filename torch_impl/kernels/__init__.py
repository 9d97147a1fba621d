"""Kernels: *how* torch_impl computes attention, one explicit choice per call (KERN-1).

KERN-1: an implementation may offer several kernels; each computes the same
function; ``implementation=`` selects one; an unsupported combination is an
error, never a silent fallback.

- ``"eager"`` (``Eager``): the readable baseline, whole (B, H, Lq, Lk) logits;
- ``"sdpa"`` (``SDPA``): ``F.scaled_dot_product_attention``, vanilla calls only;
- ``"tiles"`` (``Tiles``): cache-sized tiles, causal prefix skipping, the Huang
  skew and banded Shaw sums; its knobs are the fields of ``Tiles(...)``;
- ``"flex"`` (``Flex``): FlexAttention with every logit term in one
  ``score_mod`` (key terms, soft cap, scheme biases, masks); compiled by
  default, ``Flex(compiled=False)`` eager. Never chosen automatically;
- ``"triton"`` (``Triton``): fused Triton programs, forward and backward,
  with Shaw's key and value terms, RoPE, ALiBi and T5 in their loops
  (positions that are consecutive runs; Triton's interpreter where no CUDA
  device is present). Chosen automatically for CUDA tensors only, after
  sdpa (vanilla calls go to FlashAttention), never in the interpreter.

Each kernel says what it cannot run through one method,
``unsupported(spec, call) -> Optional[str]``; the automatic choice
(``implementation=None``) asks ``automatic(spec, call)``, which is the same
method but for the triton kernel's interpreter, in the order of ``AUTO``.
"""

from __future__ import annotations

from spec import AttentionSpec

from .._core import Call
from ._base import Kernel
from .eager import Eager
from .flex import Flex
from .fused import Triton
from .sdpa import SDPA
from .tiles import Tile, Tiles

__all__ = [
    "AUTO",
    "KERNELS",
    "Call",
    "Eager",
    "Flex",
    "Kernel",
    "SDPA",
    "Tile",
    "Tiles",
    "Triton",
    "resolve",
    "supported",
]

#: name -> kernel class, the names ``implementation=`` accepts.
KERNELS: dict = {cls.name: cls for cls in (Eager, SDPA, Tiles, Flex, Triton)}
#: The automatic choice: the first of these (with default knobs) that supports the call.
AUTO = ("sdpa", "triton", "tiles")
#: Each kernel with its default knobs (frozen, so one instance serves every call).
_DEFAULTS: dict = {name: cls() for name, cls in KERNELS.items()}


def resolve(implementation, spec: AttentionSpec, call: Call) -> Kernel:
    """The kernel that runs ``call`` (KERN-1).

    ``implementation``: None (the first kernel of ``AUTO`` that supports the
    call), a name of ``KERNELS``, or a kernel object (``Tiles(query_rows=64)``).
    An unknown name is a ``ValueError`` listing the names, something else a
    ``TypeError``; a kernel that does not support the call is a ``ValueError``
    saying why and which kernels can.
    """
    if implementation is None:
        reasons = {}
        for name in AUTO:
            kernel = _DEFAULTS[name]
            reasons[name] = kernel.automatic(spec, call)
            if reasons[name] is None:
                return kernel
        raise ValueError(
            f"implementation=None: no kernel can run this call: "
            f"{'; '.join(f'{n}: {r}' for n, r in reasons.items())} (KERN-1)"
        )
    if isinstance(implementation, str):
        if implementation not in KERNELS:
            raise ValueError(
                f"implementation: expected None, one of {_names(KERNELS)} or a kernel object such as "
                f"torch_impl.kernels.Tiles(...), got {implementation!r}"
            )
        kernel = _DEFAULTS[implementation]
    elif isinstance(implementation, tuple(KERNELS.values())):
        kernel = implementation
    else:
        raise TypeError(
            f"implementation: expected None, one of {_names(KERNELS)} or a kernel object such as "
            f"torch_impl.kernels.Tiles(...), got {implementation!r} of type "
            f"{type(implementation).__name__}"
        )
    reason = kernel.unsupported(spec, call)
    if reason is not None:
        able = supported(spec, call)
        alternatives = f"kernels that can: {_names(able)}" if able else "no kernel can"
        raise ValueError(
            f"implementation={implementation!r}: cannot run this call: {reason}; {alternatives} "
            "(KERN-1: no silent fallback)"
        )
    return kernel


def _names(names) -> str:
    return ", ".join(repr(n) for n in names)


def supported(spec: AttentionSpec, call: Call) -> list:
    """The names of the kernels (default knobs) that can run ``call`` (KERN-1)."""
    return [n for n, kernel in _DEFAULTS.items() if kernel.unsupported(spec, call) is None]
