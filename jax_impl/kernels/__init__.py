"""Kernels: *how* ``jax_impl.attention`` computes (KERN-1).

An implementation may offer several kernels; each computes the same
function (the rules of spec/attention.md); ``implementation=`` selects one;
an unsupported combination is an error, never a silent fallback (KERN-1).

- ``"xla"`` (``Xla()``): the readable baseline, whole (B, H, Lq, Lk)
  logits and the schemes' plain hooks;
- ``"tiles"`` (``Tiles(query_rows=256)``): the fast algorithms (Huang skew,
  banded Shaw value sums, causal query tiles), knobs as fields;
- ``"pallas"`` (``Pallas(block_q=16, block_k=16)``): one fused Pallas program
  with Shaw's key and value terms inside (forward calls at default
  positions; interpret mode where the default backend is the CPU). Never
  chosen automatically.

``implementation=None`` takes the first of ``AUTOMATIC`` that supports the
call: ``Tiles()`` for every call of the built-in schemes. A kernel object
(``Tiles(query_rows=2)``) is a frozen dataclass, hashable, so it can be a
static argument of ``jax.jit``.
"""

from __future__ import annotations

from spec import AttentionSpec

from ._base import Call, Inputs, Kernel
from .pallas import Pallas
from .tiles import Tiles
from .xla import Xla

__all__ = ["AUTOMATIC", "NAMES", "Call", "Inputs", "Kernel", "Pallas", "Tiles", "Xla", "resolve"]

#: The kernel names ``implementation=`` accepts.
NAMES = ("xla", "tiles", "pallas")
#: The kernels the automatic choice tries, in order.
AUTOMATIC = (Tiles(), Xla())


def resolve(implementation, spec: AttentionSpec, call: Call) -> Kernel:
    """The kernel ``implementation`` names, checked against the call (KERN-1).

    None: the first of ``AUTOMATIC`` that supports the call. A name
    (``NAMES``) or a kernel object: that kernel, or ``ValueError`` saying why
    it does not support the call and which kernels do.
    """
    match implementation:
        case None:
            return _automatic(spec, call)
        case "xla":
            kernel = Xla()
        case "tiles":
            kernel = Tiles()
        case "pallas":
            kernel = Pallas()
        case Xla() | Tiles() | Pallas():
            kernel = implementation
        case str():
            raise ValueError(
                f"implementation: expected None, one of {list(NAMES)} or a kernel object "
                f"(jax_impl.kernels.Tiles(query_rows=...), ...), got {implementation!r}"
            )
        case _:
            raise TypeError(
                f"implementation: expected None, a kernel name {list(NAMES)} or a kernel object "
                f"(jax_impl.kernels.Xla(), jax_impl.kernels.Tiles(...), jax_impl.kernels.Pallas(...)), "
                f"got {type(implementation).__name__}"
            )
    reason = kernel.unsupported(spec, call)
    if reason is not None:
        others = [k.name for k in AUTOMATIC if k.name != kernel.name and k.unsupported(spec, call) is None]
        raise ValueError(
            f"implementation={implementation!r} does not support this call: {reason}; "
            f"kernels that do: {others} (KERN-1)"
        )
    return kernel


def _automatic(spec: AttentionSpec, call: Call) -> Kernel:
    reasons = {}
    for kernel in AUTOMATIC:
        reason = kernel.unsupported(spec, call)
        if reason is None:
            return kernel
        reasons[kernel.name] = reason
    raise ValueError(f"implementation=None: expected a kernel that supports this call, got none: {reasons} (KERN-1)")
