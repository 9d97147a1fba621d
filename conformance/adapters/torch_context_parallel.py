"""PyTorch's own context parallelism, its FlexAttention path, on 2 gloo processes: ``torch-cp-flex`` (the tokens
in order) and ``torch-cp-flex-balanced`` (PyTorch's head-tail load balancer, the zigzag order of BLOCK-5).

What is certified is PyTorch's machinery (torch 2.13,
``torch.distributed.tensor.experimental._context_parallel``): ``_context_parallel_shard`` cuts the call's
sequence buffers (the tokens, their positions, the rows of the mask and the bias) over a ``DeviceMesh`` of 2 ranks,
rearranged first by ``_HeadTailLoadBalancer`` in the balanced adapter; ``_ContextParallel`` (attention type FLEX)
puts a pre-hook on the module that calls ``flex_attention``, which all-gathers the keys and values of the ranks
(``flex_cp_allgather``); FlexAttention then computes the rank's query rows against every key. The score terms are
one ``score_mod`` (``torch_impl.kernels.flex.score_mod_for``: the relative terms, the soft cap, the bias, the
masks as -inf), and the projections and the q/k transform (RoPE) are attnspec's, per rank, at the tokens'
positions.

BLOCK-1 is where users go wrong: the ``score_mod`` that PyTorch's hook runs gets the rank's *local* query index
``q_idx`` (0 .. Ls - 1 on every rank) and the key index ``kv_idx`` of the gathered keys, which under load
balancing are in the rearranged order; PyTorch maps the indices of a ``mask_mod`` (``_create_cp_block_mask``) but
not those of a ``score_mod``. A score that reads ``q_idx`` and ``kv_idx`` as token indices is wrong on every rank
but the first (tests/test_torch_context_parallel.py measures it). These adapters read positions instead (POS-1):
the query positions are a buffer sharded with the tokens, the key positions the ranks' shards gathered in the
order of the gathered keys, and the columns of the mask and the bias are put in that order too (the balancer's
indices). Masks go through the ``score_mod`` as -inf, not a block mask: ``_create_cp_block_mask`` needs Lq a
multiple of 2 x 128, which the catalog's cases are not.

Lengths are padded to the shard unit (2, 4 balanced) as ``torch:ring`` pads them (extra keys masked, extra rows
dropped); under ``mask_fill`` (MASK-6) the unit must divide Lk. Forward only: PyTorch 2.13 has no FlexAttention
backward on the CPU. Dead keys are not zeroed (MASK-7 is the user's to do; PyTorch does not).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np

from . import _torch
from .base import FEATURES, Adapter, Capabilities
from .ring import _serve, _Workers, bias_padding, pad_inputs, padded_lengths
from .torch_impl_adapter import FLEX_NO_CPU_GRADIENTS

#: The ranks of the mesh.
RANKS = 2
#: What the score_mod of these adapters cannot be asked for.
CP_FLEX_MISSING = {
    "shaw-values": "FlexAttention returns no weights, from which a value term (SHAW-4) is summed",
    "huang-values": "FlexAttention returns no weights, from which a value term (HUANG-3) is summed",
    "shaw-key-side": "the key-side term's table logits (SHAW-6) need every key's projection, which PyTorch's "
    "hook gathers inside the module, after the score_mod is built",
    "dropout-keep": "FlexAttention takes no keep mask (DROP-1)",
    "dropout-spec": "FlexAttention has no dropout",
    "validates-input": "the harness shards a call before PyTorch sees it; the argument checks are certified on torch",
}


class TorchContextParallelFlexAdapter(Adapter):
    name = "torch-cp-flex"
    description = (
        "PyTorch's context parallelism on 2 gloo ranks, FlexAttention path (torch 2.13: _context_parallel_shard, "
        "_ContextParallel's all-gather of keys and values), a score_mod of positions; forward only on the CPU"
    )
    balanced: ClassVar[bool] = False

    def __init__(self):
        self._workers = None

    def unavailable(self):
        return _torch.torch_available()

    def capabilities(self):
        return Capabilities(
            devices=("cpu",),
            features=FEATURES - set(CP_FLEX_MISSING),
            weights=False,
            notes=dict(CP_FLEX_MISSING),
            no_gradients={"cpu": FLEX_NO_CPU_GRADIENTS},
        )

    @property
    def layout(self) -> str:
        return "zigzag" if self.balanced else "contiguous"

    def unsupported_case(self, case):
        unit = 2 * RANKS if self.balanced else RANKS
        if case.spec.mask_fill is not None and case.dims.Lk % unit:
            return (
                f"mask_fill counts every key (MASK-6), so the keys cannot be padded, and Lk = {case.dims.Lk} is not "
                f"a multiple of the shard unit {unit}"
            )
        return None

    def environment(self):
        import torch

        return {**_torch.pin_numerics(), "backend": "gloo", "ranks": RANKS, "load_balancer": self.balanced,
                "torch": torch.__version__}  # fmt: skip

    def forward(self, spec, params, inputs, *, device, need_weights):
        if self._workers is None:
            self._workers = _Workers(type(self).worker, RANKS)
        Lq, _, Lq2, _ = padded_lengths(spec, inputs, RANKS, self.layout)
        parts = self._workers.call((spec, params, inputs, self.balanced), RANKS)
        out = np.zeros((parts[0][1].shape[0], Lq2) + parts[0][1].shape[2:], parts[0][1].dtype)
        for tokens, rows in parts:
            out[:, tokens] = rows
        return {"out": out[:, :Lq]}

    def vjp(self, spec, params, inputs, grad_out, *, device):
        raise NotImplementedError(FLEX_NO_CPU_GRADIENTS)

    @staticmethod
    def worker(conn, rank, count, address):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        torch.set_num_threads(1)
        _torch.pin_numerics()
        dist.init_process_group("gloo", init_method=f"file://{address}", rank=rank, world_size=count)
        mesh = init_device_mesh("cpu", (count,))
        _serve(conn, functools.partial(_rank_handle, rank, mesh))


class TorchContextParallelFlexBalancedAdapter(TorchContextParallelFlexAdapter):
    name = "torch-cp-flex-balanced"
    description = (
        "PyTorch's context parallelism on 2 gloo ranks with its head-tail load balancer, FlexAttention path "
        "(torch 2.13), a score_mod of positions mapped through the balancer's order; forward only on the CPU"
    )
    balanced = True


def _flex_module():
    """A module whose forward is ``flex_attention``: what ``_ContextParallel`` hooks."""
    import warnings

    import torch
    from torch.nn.attention.flex_attention import flex_attention

    class Flex(torch.nn.Module):
        def forward(self, query, key, value, **kwargs):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                return flex_attention(query, key, value, **kwargs)

    return Flex()


def _rank_handle(rank, mesh, spec, params, inputs, balanced):
    """This rank's output rows (B, Ls, D) and their token indices."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import (
        _context_parallel_shard,
        _ContextParallel,
        _HeadTailLoadBalancer,
    )

    from torch_impl import _core
    from torch_impl.kernels._base import transform_qk
    from torch_impl.kernels.flex import score_mod_for

    n = mesh.size()
    layout = "zigzag" if balanced else "contiguous"  # PyTorch's head-tail order is BLOCK-5's zigzag
    Lq, Lk, Lq2, Lk2 = padded_lengths(spec, inputs, n, layout)
    t = {k: _torch.to_torch(a, "cpu") for k, a in {**params, **inputs}.items()}
    other = {k: torch.as_tensor(a) for k, a in pad_inputs(spec, inputs, n, layout).items()}
    x = F.pad(t["query"], (0, 0, 0, Lq2 - Lq))
    key = F.pad(t.get("key", t["query"]), (0, 0, 0, Lk2 - Lk))
    value = F.pad(t["value"], (0, 0, 0, Lk2 - Lk)) if "value" in t else key
    B = x.shape[0]

    def balancer(L):
        return _HeadTailLoadBalancer(L, n, torch.device("cpu")) if balanced else None

    def order(L):
        return balancer(L)._generate_indices()[0] if balanced else torch.arange(L)

    q_pos = other["q_positions"].reshape(-1, Lq2).expand(B, -1).contiguous()  # (B, Lq2)
    k_pos = other["k_positions"].reshape(-1, Lk2).expand(B, -1).contiguous()
    # the per-pair inputs: rows sharded with the queries, columns in the order the gathered keys take
    pairs = {}
    if "mask" in other:
        pairs["mask"] = other["mask"][..., order(Lk2)]
    if "bias" in t:
        b = t["bias"]
        widths = bias_padding(tuple(b.shape), Lq, Lk, Lq2, Lk2)
        b4 = F.pad(_core.as_4d(b), [w for pair in reversed(widths) for w in pair])
        pairs["bias"] = b4[..., order(Lk2)] if b4.shape[3] == Lk2 else b4
    row_names = [k for k, a in pairs.items() if a.shape[2] == Lq2]
    tokens = torch.arange(Lq2).expand(1, -1)
    x_local, q_pos_local, tokens_local, *rows = _context_parallel_shard(
        mesh, [x, q_pos, tokens, *(pairs[k] for k in row_names)], [1, 1, 1, *([2] * len(row_names))], balancer(Lq2)
    )
    pairs.update(zip(row_names, rows))
    key_local, value_local, k_pos_local = _context_parallel_shard(mesh, [key, value, k_pos], [1, 1, 1], balancer(Lk2))
    gathered = [torch.empty_like(k_pos_local) for _ in range(n)]  # the key positions, as the keys are gathered
    dist.all_gather(gathered, k_pos_local.contiguous())
    k_pos_all = torch.cat(gathered, dim=1)

    p, H, Hkv = t, spec.num_heads, spec.kv_heads
    q = _core.split_heads(_core.project(x_local, p["wq"], p.get("bq")), H)  # (B, H, Ls, d)
    k = _core.split_heads(_core.project(key_local, p["wk"], p.get("bk")), Hkv)
    v = _core.split_heads(_core.project(value_local, p["wv"], p.get("bv")), Hkv)
    local = _core.Call(B, q.shape[2], k.shape[2], q.device, q_positions=q_pos_local, k_positions=k_pos_local)
    q, k = transform_qk(spec, p, q, k, local)  # REL-3 (1): per token, at its position
    call = _core.Call(
        B, q.shape[2], Lk2, q.device, mask=pairs.get("mask"), bias=pairs.get("bias"), q_positions=q_pos_local,
        k_positions=k_pos_all, causal=spec.causal, window=spec.window,
    )  # fmt: skip
    tables = {name: a for name, a in p.items() if name in params}
    score_mod = score_mod_for(spec, tables, q, k, call, _core.stat_dtype(q.dtype))
    module = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)._apply(
        _flex_module(), mesh
    )
    with torch.no_grad():
        o = module(q, k, v, score_mod=score_mod, scale=spec.effective_scale, enable_gqa=Hkv != H)
        out = _core.project(_core.merge_heads(o), p["wo"], p.get("bo"))
    return tokens_local[0].numpy(), _torch.to_numpy(out)
