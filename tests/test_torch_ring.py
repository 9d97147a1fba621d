"""``torch_impl.ring_attention`` (BLOCK-1..BLOCK-5) over gloo process groups of 2 and 4 ranks on this machine,
against the float64 reference: every rank's output rows and input gradients, and the parameters' gradients
summed over the ranks, for Shaw and Huang with value terms, ALiBi, T5, RoPE, masks and biases, both layouts.

Each configuration runs in its own processes (``torch.multiprocessing``, gloo over a file store); rank 0
gathers what every rank computed and writes its errors against ``numpy_ref`` as JSON. Marker ``ring``.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, T5Bias  # noqa: E402
from torch_impl.ring import shard_tokens  # noqa: E402

pytestmark = pytest.mark.ring

L = 16
CALLS = {
    "shaw-values-causal-zigzag": (AttentionSpec(2, 4, relative=Shaw(3, per_head=True), causal=True), "zigzag", {}),
    "huang-values-gqa-causal": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Huang(16, values=True), causal=True),
        "contiguous",
        {},
    ),
    "alibi-mask-bias-zigzag": (AttentionSpec(2, 4, relative=Alibi()), "zigzag", {"mask": True, "bias": True}),
    "t5-causal": (AttentionSpec(2, 4, relative=T5Bias(8, 12, bidirectional=False), causal=True), "contiguous", {}),
    "rope-window": (AttentionSpec(2, 4, relative=Rope(), window=(3, 2)), "contiguous", {}),
}


def _inputs(name):
    spec, layout, extra = CALLS[name]
    rng = np.random.default_rng(7)
    params = {k: rng.normal(size=a.shape) for k, a in numpy_ref.init_params(spec, 0).items()}
    x = rng.normal(size=(2, L, spec.model_dim))
    g = rng.normal(size=x.shape)
    kw = {}
    if extra.get("mask"):
        kw["mask"] = rng.random((2, 1, L, L)) < 0.6
        kw["mask"][0, :, 3] = False  # a query with no allowed key (MASK-5)
        kw["mask"][1, :, :, 5] = False  # a dead key (MASK-7)
    if extra.get("bias"):
        kw["bias"] = rng.normal(size=(L, L))
    return spec, layout, params, x, g, kw


def _rank(rank, n, name, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    try:
        spec, layout, params, x, g, kw = _inputs(name)
        rows = shard_tokens(L, n, rank, layout)
        p = {k: torch.tensor(a, requires_grad=True) for k, a in params.items()}
        xs = torch.tensor(x[:, rows], requires_grad=True)
        tkw = {}
        if "mask" in kw:
            tkw["mask"] = torch.as_tensor(kw["mask"][:, :, rows])
        if "bias" in kw:
            tkw["bias"] = torch.tensor(kw["bias"][rows], requires_grad=True)
        out_rows = torch_impl.ring_attention(spec, p, xs, layout=layout, **tkw)
        out_rows.backward(torch.as_tensor(g[:, rows]))
        grads = {k: t.grad for k, t in p.items()}
        for t in grads.values():
            dist.all_reduce(t)  # each rank's part of the parameters' gradients
        gathered = [None] * n
        mine = {"rows": rows.tolist(), "out": out_rows.detach().numpy().tolist(), "x": xs.grad.numpy().tolist()}
        if "bias" in tkw:
            mine["bias"] = tkw["bias"].grad.numpy().tolist()
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            want = numpy_ref.attention(spec, params, x, **kw)
            vjp = numpy_ref.attention_vjp(spec, params, x, x, x, g, **kw)
            got_out, got_x = np.zeros_like(want), np.zeros_like(x)
            got_bias = np.zeros((L, L))
            for part in gathered:
                got_out[:, part["rows"]] = part["out"]
                got_x[:, part["rows"]] = part["x"]
                if "bias" in part:
                    got_bias[part["rows"]] = part["bias"]
            scale = max(np.abs(a).max() for a in vjp.values())
            errors = {"out": float(np.abs(got_out - want).max() / np.abs(want).max())}
            errors["x"] = float(np.abs(got_x - (vjp["query"] + vjp["key"] + vjp["value"])).max() / scale)
            errors.update({k: float(np.abs(grads[k].numpy() - vjp[k]).max() / scale) for k in params})
            if "bias" in kw:
                errors["bias"] = float(np.abs(got_bias - vjp["bias"]).max() / scale)
            with open(out, "w") as f:
                json.dump(errors, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", CALLS)
def test_the_torch_ring_is_the_unsharded_attention(tmp_path, name, n):
    """BLOCK-1..BLOCK-5, GRAD-1: the ring's rows, the gradients of each rank's tokens (the query, key and value
    roles of self-attention summed) and of the bias rows, and the parameters' gradients summed over the ranks
    equal numpy_ref's in float64."""
    out = tmp_path / "errors.json"
    mp.spawn(_rank, args=(n, name, str(tmp_path / "store"), str(out)), nprocs=n, join=True)
    errors = json.loads(out.read_text())
    assert max(errors.values()) < 1e-12, errors


@pytest.mark.parametrize(
    "L_,n,layout,message",
    [
        (12, 4, "zigzag", "L: expected a multiple of 8 (2 x 4 ranks), got 12"),
        (12, 5, "contiguous", "L: expected a multiple of 5 (5 ranks), got 12"),
        (16, 2, "striped", "layout: expected one of 'contiguous', 'zigzag', got 'striped'"),
    ],
)
def test_a_shard_that_cannot_be_cut_is_an_error(L_, n, layout, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shard_tokens(L_, n, 0, layout)


def test_the_shards_by_hand():
    """BLOCK-5: 8 tokens on 2 ranks; zigzag: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2."""
    assert shard_tokens(8, 2, 1).tolist() == [4, 5, 6, 7]
    assert shard_tokens(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert shard_tokens(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]


def _send_transposed(rank, n, store, out):
    from torch_impl.ring import _shift

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    try:
        block = torch.arange(12.0, dtype=torch.float64).reshape(3, 4).add(100 * rank)
        (passed,) = _shift([block.t()], None, +1)  # non-contiguous, as autograd's gradients often are
        (grad,) = _shift([torch.ones(3, 4, dtype=torch.float64).t() * (rank + 1)], None, -1)  # the other way
        got = {"passed": passed.tolist(), "grad": grad.t().tolist()}
        gathered = [None] * n
        dist.all_gather_object(gathered, got)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()


def test_a_non_contiguous_block_and_its_gradient_arrive_whole(tmp_path):
    """A transposed block sent round the ring arrives as the same values on the next rank, and a transposed
    gradient sent the other way arrives from that rank (gloo sent a non-contiguous gradient of an all_gather
    wrong: every tensor is made contiguous before it is sent)."""
    out = tmp_path / "ring.json"
    mp.spawn(_send_transposed, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    got = json.loads(out.read_text())
    base = np.arange(12.0).reshape(3, 4)
    for rank in (0, 1):
        other = 1 - rank
        np.testing.assert_array_equal(got[rank]["passed"], (base + 100 * other).T)  # from the previous rank
        np.testing.assert_array_equal(got[rank]["grad"], np.full((3, 4), other + 1.0))  # from the next rank
