"""``jax_impl.ring_attention`` (BLOCK-1..BLOCK-5) on 8 host devices against the float64 reference: forward and
gradients, every scheme, 2, 4 and 8 shards, the contiguous and the load-balanced (zigzag) layouts.

JAX fixes its number of host devices when it starts, so the ring runs in a process of its own
(``--xla_force_host_platform_device_count=8``); that process prints each call's errors against
``numpy_ref.attention`` and ``numpy_ref.attention_vjp`` as JSON. Marker ``ring``: .ci/run's tier (about a
minute on 2 cores), not the default run.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

pytestmark = pytest.mark.ring

SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh
import jax_impl, numpy_ref
from spec import Alibi, AttentionSpec, Huang, Rope, Shaw, Swin, T5Bias

devices = np.array(jax.devices())
rng = np.random.default_rng(0)
mask = rng.random((2, 1, 16, 16)) < 0.6
mask[0, :, 3] = False  # a query with no allowed key (MASK-5)
mask[1, :, :, 5] = False  # a dead key (MASK-7)
CALLS = {
    "vanilla-4-contiguous": (AttentionSpec(2, 4), 4, "contiguous", 16, {}),
    "shaw-values-causal-8-zigzag": (
        AttentionSpec(2, 4, relative=Shaw(3, per_head=True), causal=True), 8, "zigzag", 16, {}),
    "shaw-causal-2-contiguous": (AttentionSpec(2, 4, relative=Shaw(3), causal=True), 2, "contiguous", 16, {}),
    "huang-values-gqa-causal-4-zigzag": (
        AttentionSpec(4, 4, num_kv_heads=2, relative=Huang(16, values=True), causal=True), 4, "zigzag", 16, {}),
    "alibi-4-contiguous": (AttentionSpec(2, 4, relative=Alibi()), 4, "contiguous", 16, {}),
    "t5-causal-8-zigzag": (
        AttentionSpec(2, 4, relative=T5Bias(8, 12, bidirectional=False), causal=True), 8, "zigzag", 32, {}),
    "rope-8-contiguous": (AttentionSpec(2, 4, relative=Rope()), 8, "contiguous", 16, {}),
    "swin-4-contiguous": (AttentionSpec(2, 4, relative=Swin((4, 4))), 4, "contiguous", 16, {}),
    "shaw-mask-bias-4-zigzag": (AttentionSpec(2, 4, relative=Shaw(2)), 4, "zigzag", 16,
                                {"mask": mask, "bias": rng.normal(size=(16, 16))}),
    "shaw-mask-fill-4-contiguous": (AttentionSpec(2, 4, relative=Shaw(2), mask_fill=-1e9), 4, "contiguous", 16,
                                    {"mask": mask}),
    "shaw-dropout-keep-4-contiguous": (AttentionSpec(2, 4, relative=Shaw(2), dropout=0.3), 4, "contiguous", 16,
                                       {"dropout_keep": rng.random((2, 2, 16, 16)) < 0.7}),
    "shaw-window-softcap-positions-4-zigzag": (
        AttentionSpec(2, 4, relative=Shaw(2), causal=True, window=(3, 0), softcap=5.0), 4, "zigzag", 16,
        {"q_positions": np.array([np.arange(16) + 5, np.arange(16) + 40]), "k_positions": np.arange(16) + 5}),
}
out = {}
for name, (spec, n, layout, L, kw) in CALLS.items():
    mesh = Mesh(devices[:n], ("seq",))
    params = {k: rng.normal(size=a.shape) for k, a in numpy_ref.init_params(spec, 0).items()}
    x = rng.normal(size=(2, L, spec.model_dim))
    g = rng.normal(size=x.shape)
    jkw = {k: jnp.asarray(a) for k, a in kw.items() if k != "bias"}
    bias = jnp.asarray(kw["bias"]) if "bias" in kw else None

    def ring(p, x, k, v, b):
        return jax_impl.ring_attention(spec, p, x, k, v, mesh=mesh, axis_name="seq", layout=layout, bias=b, **jkw)

    def both(p, x, k, v, b):
        o, pullback = jax.vjp(ring, p, x, k, v, b)
        return o, pullback(jnp.asarray(g))

    j = lambda a: jnp.asarray(a)
    o, (gp, gq, gk, gv, gb) = jax.jit(both)({k: j(a) for k, a in params.items()}, j(x), j(x), j(x), bias)
    want = numpy_ref.attention(spec, params, x, x, x, **kw)
    grads = numpy_ref.attention_vjp(spec, params, x, x, x, g, **kw)
    got = {**gp, "query": gq, "key": gk, "value": gv, **({"bias": gb} if bias is not None else {})}
    scale = max(np.abs(a).max() for a in grads.values())
    out[name] = {
        "out": float(np.abs(np.asarray(o) - want).max() / np.abs(want).max()),
        "grads": max(float(np.abs(np.asarray(got[k]) - a).max() / scale) for k, a in grads.items()),
        "names": sorted(got) == sorted(grads),
    }
errors = {}
spec = AttentionSpec(2, 4)
params = {k: jnp.asarray(a) for k, a in numpy_ref.init_params(spec, 0).items()}
for label, L, kw in (
    ("length", 12, {"layout": "zigzag"}),
    ("layout", 16, {"layout": "striped"}),
    ("axis", 16, {"axis_name": "model"}),
):
    try:
        jax_impl.ring_attention(spec, params, jnp.ones((1, L, 8)), mesh=Mesh(devices[:4], ("seq",)),
                                **{"axis_name": "seq", **kw})
        errors[label] = None
    except ValueError as e:
        errors[label] = str(e)
print(json.dumps({"calls": out, "errors": errors}))
"""


@pytest.fixture(scope="module")
def results():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CALLS = [
    "vanilla-4-contiguous",
    "shaw-values-causal-8-zigzag",
    "shaw-causal-2-contiguous",
    "huang-values-gqa-causal-4-zigzag",
    "alibi-4-contiguous",
    "t5-causal-8-zigzag",
    "rope-8-contiguous",
    "swin-4-contiguous",
    "shaw-mask-bias-4-zigzag",
    "shaw-mask-fill-4-contiguous",
    "shaw-dropout-keep-4-contiguous",
    "shaw-window-softcap-positions-4-zigzag",
]


@pytest.mark.parametrize("name", CALLS)
def test_the_ring_is_the_unsharded_attention(results, name):
    """BLOCK-1..BLOCK-5, GRAD-1: the ring's output and the gradients of every parameter and input (through
    shard_map and ppermute) equal numpy_ref's in float64, for every scheme (Shaw and Huang value terms
    included), grouped heads, masks with an empty row and a dead key, -inf-free biases, mask_fill, keep masks,
    windows, soft caps and per-batch positions, on 2, 4 and 8 shards, contiguous and zigzag."""
    r = results["calls"][name]
    assert r["names"], name
    assert r["out"] < 1e-12, r
    assert r["grads"] < 1e-12, r


@pytest.mark.parametrize(
    "label,message",
    [
        ("length", "Lq: expected a multiple of 8 (2 x 4 shards on axis 'seq'), got 12"),
        ("layout", "layout: expected one of 'contiguous', 'zigzag', got 'striped'"),
        ("axis", "axis_name: expected one of the mesh's axes ('seq',), got 'model'"),
    ],
)
def test_the_ring_names_what_it_cannot_shard(results, label, message):
    assert results["errors"][label] == message


def test_the_zigzag_order_by_hand():
    """BLOCK-5: 8 tokens on 2 shards: chunks of 2, shard 0 holds chunks 0 and 3, shard 1 chunks 1 and 2."""
    from jax_impl.ring import zigzag_order

    assert zigzag_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]


def test_the_ring_memory_figure_runs(tmp_path):
    """``python -m benchmarks.ring_memory`` (its own process: it sets the host device count) writes its table,
    JSON and plot; each shard's temporary memory falls with the shards (a smoke run at L = 256)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.ring_memory", "--lengths", "256", "--shards", "1", "2", "4",
         "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "ring_memory.json").read_text())
    forward = {r["shards"]: r["temp_mib"] for r in rows if r["mode"] == "forward"}
    assert sorted(forward) == [0, 1, 2, 4] and forward[4] < forward[2] < forward[1]
    assert "| 256 | forward |" in (tmp_path / "ring_memory.md").read_text()
    assert (tmp_path / "ring_memory.png").stat().st_size > 10_000
