"""``torch_impl``, attnspec's own PyTorch implementation: every feature, CPU and CUDA."""

from __future__ import annotations

from . import _torch
from .base import Capabilities

KWARGS = ("mask", "bias", "q_positions", "k_positions", "dropout_keep")
DENSE = ("query", "key", "value", "bias")


class TorchImplAdapter(_torch.TorchAdapter):
    name = "torch"
    description = "torch_impl.attention (functional core) and torch_impl.MultiHeadAttention"

    def capabilities(self):
        return Capabilities(devices=_torch.devices())

    def _call(self, spec, params, inputs, device, requires_grad, need_weights):
        import torch_impl

        t = {n: _torch.to_torch(a, device, requires_grad and n in (*DENSE, *params))
             for n, a in {**params, **inputs}.items()}
        p = {n: t[n] for n in params}
        kw = {n: t[n] for n in KWARGS if n in t}
        result = torch_impl.attention(spec, p, t["query"], t.get("key"), t.get("value"), **kw,
                                      return_weights=need_weights)
        return t, result

    def forward(self, spec, params, inputs, *, device, need_weights):
        import torch

        with torch.no_grad():
            _, result = self._call(spec, params, inputs, device, False, need_weights)
        if need_weights:
            return {"out": _torch.to_numpy(result[0]), "weights": _torch.to_numpy(result[1])}
        return {"out": _torch.to_numpy(result)}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        t, out = self._call(spec, params, inputs, device, True, False)
        out.backward(_torch.to_torch(grad_out, device))
        return {n: _torch.to_numpy(x.grad) for n, x in t.items() if x.requires_grad}

    def roundtrip_params(self, spec, params):
        import torch_impl

        m = torch_impl.MultiHeadAttention(spec, dtype=_torch.dtype_of(params["wq"]))
        return m.load_canonical(params).canonical_params()

    def relative_indices(self, spec, q_positions, k_positions, B, Lq, Lk):
        import torch
        from spec import Shaw
        from torch_impl import relative

        qp = torch.arange(Lq) if q_positions is None else torch.as_tensor(q_positions)
        kp = torch.arange(Lk) if k_positions is None else torch.as_tensor(k_positions)
        delta = kp.reshape(-1, Lk).unsqueeze(1) - qp.reshape(-1, Lq).unsqueeze(2)
        if isinstance(spec.relative, Shaw):
            return relative.shaw_index(delta, spec.relative.max_distance).numpy()
        row, valid = relative.huang_index(delta, spec.relative.max_len)
        return torch.where(valid, row, -1).numpy()
