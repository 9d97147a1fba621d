"""``torch.nn.MultiheadAttention`` (batch_first), loaded with the canonical parameters.

Mapping (spec/comparison.md): ``in_proj_weight`` stacks wq.T, wk.T, wv.T
(PyTorch stores (out, in)); ``out_proj.weight`` is wo.T. Its boolean masks
are True = *not allowed*, so the adapter passes the inverted allowed mask as
``attn_mask`` of shape (B*H, Lq, Lk); a bias goes in as a float attn_mask.
"""

from __future__ import annotations

import numpy as np

from . import _torch
from .base import Capabilities


def to_module(spec, params: dict, device: str, dtype):
    import torch

    D, H = spec.model_dim, spec.num_heads
    m = torch.nn.MultiheadAttention(D, H, bias=spec.bias, batch_first=True, device=device, dtype=dtype)
    with torch.no_grad():
        t = {n: _torch.to_torch(a, device) for n, a in params.items()}
        m.in_proj_weight.copy_(torch.cat([t["wq"].T, t["wk"].T, t["wv"].T], dim=0))
        m.out_proj.weight.copy_(t["wo"].T)
        if spec.bias:
            m.in_proj_bias.copy_(torch.cat([t["bq"], t["bk"], t["bv"]]))
            m.out_proj.bias.copy_(t["bo"])
    return m.eval()


def from_module(spec, m) -> dict:
    D = spec.model_dim
    w = _torch.to_numpy(m.in_proj_weight)
    params = {"wq": w[:D].T.copy(), "wk": w[D:2 * D].T.copy(), "wv": w[2 * D:].T.copy(),
              "wo": _torch.to_numpy(m.out_proj.weight).T.copy()}
    if spec.bias:
        b = _torch.to_numpy(m.in_proj_bias)
        params.update(bq=b[:D].copy(), bk=b[D:2 * D].copy(), bv=b[2 * D:].copy(), bo=_torch.to_numpy(m.out_proj.bias))
    return params


def grads_of(spec, m) -> dict:
    D = spec.model_dim
    g = _torch.to_numpy(m.in_proj_weight.grad)
    grads = {"wq": g[:D].T, "wk": g[D:2 * D].T, "wv": g[2 * D:].T, "wo": _torch.to_numpy(m.out_proj.weight.grad).T}
    if spec.bias:
        b = _torch.to_numpy(m.in_proj_bias.grad)
        grads.update(bq=b[:D], bk=b[D:2 * D], bv=b[2 * D:], bo=_torch.to_numpy(m.out_proj.bias.grad))
    return grads


class TorchMHAAdapter(_torch.TorchAdapter):
    name = "torch-mha"
    description = "torch.nn.MultiheadAttention(batch_first=True) with the canonical parameters"

    def capabilities(self):
        return Capabilities(
            devices=_torch.devices(),
            features=frozenset({"cross-attention", "no-projection-bias", "causal", "mask", "bias", "dropout-spec"}),
            notes={"custom-scale": "the scale is fixed at 1/sqrt(head_dim)", "positions": "no position input",
                   "shaw": "no relative positions", "huang": "no relative positions",
                   "mask-fill": "masked logits are -inf", "dropout-keep": "dropout uses its own RNG"},
        )

    def _run(self, spec, m, inputs, device, leaves):
        import torch

        x = leaves["query"]
        key = leaves.get("key", x)
        value = leaves.get("value", key)
        B, Lq, _ = x.shape
        Lk, H = key.shape[1], spec.num_heads
        allowed = _torch.allowed_mask(spec, inputs, B, H, Lq, Lk, device)
        bias = leaves.get("bias")
        if bias is not None:
            attn_mask = torch.broadcast_to(bias, (B, H, Lq, Lk)).masked_fill(~allowed, float("-inf"))
        else:
            attn_mask = ~allowed  # True = not allowed
        attn_mask = attn_mask.reshape(B * H, Lq, Lk)
        return m(x, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        m = to_module(spec, params, device, _torch.dtype_of(inputs["query"]))
        leaves = {n: _torch.to_torch(inputs[n], device) for n in ("query", "key", "value", "bias") if n in inputs}
        with torch.no_grad():
            out, w = self._run(spec, m, inputs, device, leaves)
        result = {"out": _torch.to_numpy(out)}
        if need_weights:
            result["weights"] = _torch.to_numpy(w)
        return result

    def vjp(self, spec, params, inputs, grad_out, *, device):
        m = to_module(spec, params, device, _torch.dtype_of(inputs["query"]))
        leaves = {n: _torch.to_torch(inputs[n], device, requires_grad=True)
                  for n in ("query", "key", "value", "bias") if n in inputs}
        out, _ = self._run(spec, m, inputs, device, leaves)
        out.backward(_torch.to_torch(grad_out, device))
        grads = {n: _torch.to_numpy(leaf.grad) for n, leaf in leaves.items()}
        grads.update(grads_of(spec, m))
        return {n: np.asarray(g) for n, g in grads.items()}

    def roundtrip_params(self, spec, params):
        m = to_module(spec, params, "cpu", _torch.dtype_of(params["wq"]))
        return from_module(spec, m)
