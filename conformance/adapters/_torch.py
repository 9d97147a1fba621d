"""Shared plumbing of the PyTorch adapters: conversion, devices, numerics pinning."""

from __future__ import annotations

import numpy as np

from .base import Adapter


def torch_available():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return f"torch is not installed ({e}); pip install attnspec[torch]"
    return None


def devices() -> tuple:
    import torch

    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def pin_numerics() -> dict:
    """TF32 off and full-precision float32 matmuls while checking conformance."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {
        "torch": torch.__version__,
        "allow_tf32": False,
        "float32_matmul_precision": "highest",
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }


def torch_dtype(name: str):
    """The torch dtype of a test dtype name ("float64", "float32", "float16", "bfloat16")."""
    import torch

    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
        name
    ]


def dtype_of(a: np.ndarray):
    return torch_dtype(a.dtype.name)


def to_torch(a, device: str, requires_grad: bool = False):
    """A NumPy array as a tensor of the same dtype (bfloat16 through float32, exactly)."""
    import torch

    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    t = t.to(device)
    return t.requires_grad_(True) if requires_grad else t


def to_numpy(t) -> np.ndarray:
    import torch

    if t is None:
        return None
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def allowed_mask(spec, inputs: dict, B: int, H: int, Lq: int, Lk: int, device: str):
    """The boolean allowed-key mask (B, H, Lq, Lk) from mask, top-left causal (CAUSAL-1) and the window
    (WINDOW-1) on the default positions' distance delta[i, j] = j - i (these adapters take no positions)."""
    import torch

    allowed = torch.ones((B, H, Lq, Lk), dtype=torch.bool, device=device)
    delta = torch.arange(Lk, device=device) - torch.arange(Lq, device=device).unsqueeze(1)  # (Lq, Lk), POS-1
    if spec.causal:
        allowed = allowed & (delta <= 0)
    left, right = (None, None) if spec.window is None else spec.window
    if left is not None:
        allowed = allowed & (delta >= -left)
    if right is not None:
        allowed = allowed & (delta <= right)
    if inputs.get("mask") is not None:
        allowed = allowed & to_torch(inputs["mask"], device)
    return allowed


class TorchAdapter(Adapter):
    """Base of the PyTorch adapters: availability and numerics pinning."""

    def unavailable(self):
        return torch_available()

    def environment(self):
        return pin_numerics()
