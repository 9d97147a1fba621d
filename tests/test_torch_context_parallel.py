"""PyTorch's own context parallelism, FlexAttention path, on 2 gloo processes (``torch-cp-flex`` and
``torch-cp-flex-balanced``): against the float64 reference, and the index pitfall its ``score_mod`` has.

PyTorch's hook (``_ContextParallel``, attention type FLEX) all-gathers the keys and values; the ``score_mod`` then
gets the rank's local query index and, under the head-tail load balancer, the key index of the rearranged keys.
A ``score_mod`` that reads those indices as token indices is wrong; one that reads positions sharded and
gathered with the tokens (the adapters') is the unsharded attention (BLOCK-1). Marker ``ring``.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import numpy_ref  # noqa: E402
from conformance.adapters.torch_context_parallel import (  # noqa: E402
    TorchContextParallelFlexAdapter,
    TorchContextParallelFlexBalancedAdapter,
)
from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, T5Bias  # noqa: E402

pytestmark = pytest.mark.ring

SPECS = {
    "shaw-causal": AttentionSpec(2, 4, relative=Shaw(3, values=False), causal=True),
    "huang-gqa-cross": AttentionSpec(4, 2, num_kv_heads=2, relative=Huang(8)),
    "t5-mask": AttentionSpec(2, 4, relative=T5Bias(4, 8)),
    "rope-window": AttentionSpec(2, 4, relative=Rope(), window=(3, 2)),
    "alibi-bias-softcap": AttentionSpec(2, 4, relative=Alibi(), softcap=2.0),
}
ADAPTERS = [TorchContextParallelFlexAdapter, TorchContextParallelFlexBalancedAdapter]


@pytest.fixture(scope="module", params=ADAPTERS, ids=lambda a: a.name)
def adapter(request):
    a = request.param()
    yield a
    if a._workers is not None:
        a._workers.stop()


def _call(name):
    spec = SPECS[name]
    rng = np.random.default_rng(3)
    params = {k: rng.normal(size=a.shape) for k, a in numpy_ref.init_params(spec, 0).items()}
    Lq, Lk = (6, 11) if name.endswith("cross") else (13, 13)  # padded to the shard unit by the adapter
    inputs = {"query": rng.normal(size=(2, Lq, 8))}
    if Lk != Lq:
        inputs["key"] = rng.normal(size=(2, Lk, 8))
        inputs["value"] = rng.normal(size=(2, Lk, 8))
    if name.startswith("t5"):
        inputs["mask"] = rng.random((2, 1, Lq, Lk)) < 0.7
        inputs["mask"][0, :, 2] = False  # a query with no allowed key (MASK-5)
    if "bias" in name:
        inputs["bias"] = rng.normal(size=(Lq, Lk))
    if name.startswith("rope"):
        inputs["q_positions"] = inputs["k_positions"] = 3 * np.arange(Lq) + 5  # explicit positions (POS-1)
    return spec, params, inputs


@pytest.mark.parametrize("name", SPECS)
def test_context_parallel_flex_with_positions_is_the_reference(adapter, name):
    """BLOCK-1, REL-1, REL-3, MASK-4, MASK-5: the ranks' rows, put back in token order, equal numpy_ref's in
    float64 (the rows of a balanced layout come back from PyTorch's rearrangement)."""
    spec, params, inputs = _call(name)
    got = adapter.forward(spec, params, inputs, device="cpu", need_weights=False)["out"]
    want = numpy_ref.attention(spec, params, inputs["query"], inputs.get("key"), inputs.get("value"),
                               **{k: v for k, v in inputs.items() if k not in ("query", "key", "value")})  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_no_gradients_on_the_cpu():
    with pytest.raises(NotImplementedError, match="FlexAttention has no backward on the CPU"):
        TorchContextParallelFlexAdapter().vjp(None, {}, {}, None, device="cpu")


def _indices(rank, n, balanced, store, out):
    """One rank: a relative bias table[j - i] as a score_mod of token indices and as one of positions."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental._context_parallel import (
        _context_parallel_shard,
        _ContextParallel,
        _HeadTailLoadBalancer,
    )
    from torch.nn.attention.flex_attention import flex_attention

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    try:
        mesh = init_device_mesh("cpu", (n,))
        gen = torch.Generator().manual_seed(0)
        B, H, L, d = 1, 2, 16, 4
        q, k, v = (torch.randn(B, H, L, d, dtype=torch.float64, generator=gen) for _ in range(3))
        table = torch.randn(2 * L - 1, dtype=torch.float64, generator=gen)
        pos = torch.arange(L).expand(B, L).contiguous()

        def by_index(score, b, h, i, j):  # what one device's score_mod reads: i, j as token indices
            return score + table[j - i + L - 1]

        want = flex_attention(q, k, v, score_mod=by_index)
        balancer = _HeadTailLoadBalancer(L, n, torch.device("cpu")) if balanced else None
        q_l, k_l, v_l, pos_l, want_l = _context_parallel_shard(mesh, [q, k, v, pos, want], [2, 2, 2, 1, 2], balancer)
        gathered = [torch.empty_like(pos_l) for _ in range(n)]
        dist.all_gather(gathered, pos_l)
        k_pos = torch.cat(gathered, 1)  # the key positions in the order the hook gathers the keys

        def by_position(score, b, h, i, j):
            return score + table[k_pos[b, j] - pos_l[b, i] + L - 1]

        module = torch.nn.Module()
        module.forward = lambda *a, **kw: flex_attention(*a, **kw)
        hooked = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)._apply(module, mesh)
        errors = {
            "index": (hooked(q_l, k_l, v_l, score_mod=by_index) - want_l).abs().max().item(),
            "position": (hooked(q_l, k_l, v_l, score_mod=by_position) - want_l).abs().max().item(),
        }
        gathered = [None] * n
        dist.all_gather_object(gathered, errors)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
        dist.barrier()  # every rank's collectives done before the group goes
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("balanced", [False, True], ids=["in-order", "head-tail"])
def test_a_score_mod_of_token_indices_is_wrong_under_context_parallelism(tmp_path, balanced):
    """PyTorch 2.13 hands the score_mod the local query index (and, balanced, the rearranged key index): a score
    of j - i is wrong on rank 1 (by more than 0.1; both ranks balanced), a score of the positions is right."""
    out = tmp_path / "errors.json"
    mp.spawn(_indices, args=(2, balanced, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    errors = json.loads(out.read_text())
    assert all(e["position"] < 1e-14 for e in errors), errors
    wrong = [e["index"] > 0.1 for e in errors]
    assert wrong == ([True, True] if balanced else [False, True]), errors
