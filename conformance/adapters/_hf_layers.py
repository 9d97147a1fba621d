"""Shared plumbing of the adapters that run one whole Hugging Face attention layer with canonical weights.

A layer's projections are ``nn.Linear`` modules named by the model (``q_proj``
or ``q``, ...); ``PROJECTIONS`` pairs each with its canonical weight and bias
(PARAM-1: canonical (in, out), ``nn.Linear`` (out, in)). The layer is built in
float32, cast to the parameters' dtype with ``.to(dtype)`` (what users do),
then loaded. Its gradients with respect to query, key and value are the
three partials: forward pre-hooks hand the key and value projections each its
own input tensor (equal in value to the one the layer passes).
"""

from __future__ import annotations

import contextlib

from . import _torch

#: (linear name, canonical weight, canonical bias) of the Llama-style layers.
LLAMA_PROJECTIONS = (("q_proj", "wq", "bq"), ("k_proj", "wk", "bk"), ("v_proj", "wv", "bv"), ("o_proj", "wo", "bo"))


def load(m, params: dict, device: str, projections=LLAMA_PROJECTIONS):
    """Copy the canonical weights (and the biases the layer has) into its linears; returns ``m``."""
    import torch

    with torch.no_grad():
        for proj, w, b in projections:
            linear = getattr(m, proj)
            linear.weight.copy_(_torch.to_torch(params[w], device).T)
            if linear.bias is not None:
                linear.bias.copy_(_torch.to_torch(params[b], device))
    return m


def canonical(m, projections=LLAMA_PROJECTIONS) -> dict:
    """PARAM-3: the layer's linears back in the canonical layout (the biases it has)."""
    out = {}
    for proj, w, b in projections:
        linear = getattr(m, proj)
        out[w] = _torch.to_numpy(linear.weight.T.contiguous())
        if linear.bias is not None:
            out[b] = _torch.to_numpy(linear.bias)
    return out


def gradients(m, projections=LLAMA_PROJECTIONS) -> dict:
    """The canonical gradients of the linears' weights and biases after a backward pass."""
    out = {}
    for proj, w, b in projections:
        linear = getattr(m, proj)
        out[w] = _torch.to_numpy(linear.weight.grad.T.contiguous())
        if linear.bias is not None:
            out[b] = _torch.to_numpy(linear.bias.grad)
    return out


@contextlib.contextmanager
def own_inputs(m, leaves: dict):
    """Within the block, each linear named in ``leaves`` (name -> tensor) takes that tensor as its input."""
    hooks = [getattr(m, proj).register_forward_pre_hook(lambda mod, args, t=t: (t,)) for proj, t in leaves.items()]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def additive_mask(spec, inputs: dict, t: dict, Lk: int):
    """The additive mask Hugging Face's encoders build from a boolean one (``get_extended_attention_mask``:
    ``finfo(dtype).min`` where a key is masked, MASK-1), plus the bias input (BIAS-1); (B, H, Lq, Lk), or None
    when the call has neither."""
    import torch

    x = t["query"]
    mask = None
    if inputs.get("mask") is not None:
        allowed = _torch.allowed_mask(spec, inputs, x.shape[0], spec.num_heads, x.shape[1], Lk, str(x.device))
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill(
            ~allowed, torch.finfo(x.dtype).min
        )
    if t.get("bias") is not None:
        mask = t["bias"] if mask is None else mask + t["bias"]
    return mask
