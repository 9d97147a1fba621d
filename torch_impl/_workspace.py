"""Reusable buffers for the tiles of one call that records no gradient.

Every tile of the explicit path writes (queries, keys)-sized intermediates:
the relative term, the logits, the weights. Fresh memory for each of them
costs page faults and zeroing by the operating system, which on the CPU was
measured at about a quarter of a Shaw forward at L = 1024 (benchmarks/).
A ``Workspace`` hands out views of a few flat buffers instead, one per slot,
grown to the largest tile; a slot is overwritten by the next tile, so only
values that die within a tile may live there: else the tiles and sdpa
kernels that use it would no longer compute the same function as the
others (KERN-1).
"""

from __future__ import annotations

import math
import threading

import torch

_LOCAL = threading.local()


class Workspace:
    def __init__(self, device: torch.device):
        self.device = device
        self._flat: dict = {}

    def take(self, slot: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape`` in slot ``slot``; its old contents are garbage."""
        n = math.prod(shape)
        buf = self._flat.get((slot, dtype))
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=self.device)
            self._flat[(slot, dtype)] = buf
        return buf[:n].view(shape)


def take(ws, slot: str, shape: tuple, dtype: torch.dtype):
    """``ws.take(...)``, or None without a workspace (the operation then allocates as usual)."""
    return None if ws is None else ws.take(slot, tuple(shape), dtype)


def persistent(device: torch.device) -> Workspace:
    """This thread's workspace for ``device``, kept from call to call (it holds the largest buffer asked
    for): only for a call that records no gradient, whose buffers are dead when it returns (a backward
    would read them after the next call overwrote them)."""
    spaces = _LOCAL.__dict__.setdefault("spaces", {})
    return spaces.setdefault(device, Workspace(device))
