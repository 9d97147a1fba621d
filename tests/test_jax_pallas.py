"""The pallas kernel (jax_impl/kernels/pallas.py) against the reference: Shaw's key and value terms in one fused
Pallas program, in interpret mode on this CPU and lowered to Triton for a GPU. Expected values come from
numpy_ref (float64)."""

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from _fused_calls import CALLS, draw  # noqa: E402

import jax_impl  # noqa: E402
import numpy_ref  # noqa: E402
from conformance.adapters import _jax  # noqa: E402
from jax_impl.kernels import Pallas  # noqa: E402
from spec import AttentionSpec, Huang, Shaw  # noqa: E402

_jax.setup()  # x64, as the harness runs it
pytestmark = pytest.mark.fused  # .ci/run's tier: pytest -m fused (not in the default run, for its time)

DTYPES = {"float64": (np.float64, 1e-13), "float32": (np.float32, 2e-6), "bfloat16": (jnp.bfloat16, 3e-2)}


def _run(name, dtype, kernel="pallas"):
    spec, params, x, y, kw, want = draw(name, lambda a: np.asarray(jnp.asarray(a).astype(dtype), np.float64))
    j = {n: jnp.asarray(a).astype(dtype) for n, a in params.items()}
    jkw = {n: (jnp.asarray(a).astype(dtype) if n == "bias" else jnp.asarray(a)) for n, a in kw.items()}
    x, y = jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)
    return jax_impl.attention(spec, j, x, y, **jkw, implementation=kernel), want


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_program_computes_the_reference(name, dtype):
    """SHAW-1..4, SCALE-2, SCALE-3, MASK-4, MASK-5, BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1, HEAD-3, HEAD-4, PREC-4:
    the online softmax with the key term's table logits and the value term's per-row weight sums, both by
    comparison with the row index (no gather), equals the reference on inputs of the dtype, to that dtype's
    rounding of the output."""
    jdtype, tol = DTYPES[dtype]
    got, want = _run(name, jdtype)
    assert got.dtype == jnp.dtype(jdtype)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("name", CALLS)
def test_gradients_through_the_kernel_are_the_reference_vjp(name):
    """GRAD-1: ``pallas_call`` has no derivative rule; the kernel's ``jax.custom_vjp`` takes the tiles kernel's
    VJP as its backward, so jax.grad through a pallas call gives every input's and table's gradient (float64,
    against numpy_ref's VJP)."""
    spec, params, x, y, kw, _, grad_out, want = draw(name, lambda a: np.asarray(a, np.float64), grad=True)
    jkw = {n: jnp.asarray(a) for n, a in kw.items() if n != "bias"}

    def loss(p, query, key, value, bias):
        out = jax_impl.attention(spec, p, query, key, value, **jkw, bias=bias, implementation="pallas")
        return jnp.vdot(out, jnp.asarray(grad_out))

    bias = jnp.asarray(kw["bias"]) if "bias" in kw else None
    args = ({n: jnp.asarray(a) for n, a in params.items()}, jnp.asarray(x), jnp.asarray(y), jnp.asarray(y), bias)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)
    got = {**g[0], "query": g[1], "key": g[2], "value": g[3], **({"bias": g[4]} if bias is not None else {})}
    assert sorted(got) == sorted(want)
    scale = max(np.abs(w).max() for w in want.values())
    for n, w in want.items():
        np.testing.assert_allclose(np.asarray(got[n]), w, rtol=0, atol=1e-12 * scale, err_msg=n)


def test_other_block_sizes_compute_the_same():
    """Pallas(block_q, block_k) are knobs of speed only: 32 x 16 blocks of a causal call equal 16 x 16."""
    small, want = _run("shaw-keys-only-causal-long", np.float64)
    big, _ = _run("shaw-keys-only-causal-long", np.float64, Pallas(block_q=32, block_k=16))
    np.testing.assert_allclose(np.asarray(big), np.asarray(small), rtol=0, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize(
    "spec,kw,message",
    [
        (AttentionSpec(2, 2, relative=Huang(3)), {}, "pallas fuses schemes whose terms are clipped tables (Shaw); "
                                                      "Huang has none"),
        (AttentionSpec(2, 2, relative=Shaw(1, key_side="own")), {}, "pallas has no key-side term (SHAW-6)"),
        (AttentionSpec(2, 2, relative=Shaw(1)), {"q_positions": True}, "pallas indexes its tables by j - i: "
                                                                        "default positions only (POS-1)"),
        (AttentionSpec(2, 2, softcap=5.0), {}, "pallas has no soft cap (SOFTCAP-1)"),
        (AttentionSpec(2, 2, mask_fill=-1e9), {}, "pallas gives disallowed keys weight 0 only, no mask_fill (MASK-6)"),
        (AttentionSpec(2, 2), {"return_weights": True}, "pallas does not return the weights (return_weights=True)"),
    ],
    ids=["huang", "key-side", "positions", "softcap", "mask-fill", "weights"],
)  # fmt: skip
def test_the_kernel_refuses_what_it_cannot_compute(spec, kw, message):
    """KERN-1: each refusal names what the pallas kernel cannot do."""
    params = {n: jnp.asarray(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = jnp.ones((2, 3, 4))
    positions = jnp.arange(3) + 1 if kw.get("q_positions") else None
    with pytest.raises(ValueError, match=re.escape(f"implementation='pallas' does not support this call: {message}")):
        jax_impl.attention(
            spec,
            params,
            x,
            q_positions=positions,
            return_weights=kw.get("return_weights", False),
            implementation="pallas",
        )


@pytest.mark.parametrize("field,value,interpret,message", [
    ("block_q", 24, None, "Pallas.block_q: expected a power of two >= 16, got 24"),
    ("block_k", 8, None, "Pallas.block_k: expected a power of two >= 16, got 8"),
    ("block_k", 8, False, "Pallas.block_k: expected a power of two >= 16, got 8"),
    ("block_q", 3, True, "Pallas.block_q: expected a power of two, got 3"),
    ("block_k", 0, True, "Pallas.block_k: expected a power of two, got 0"),
])  # fmt: skip
def test_the_block_sizes_are_checked(field, value, interpret, message):
    """Triton's dot takes blocks of 16 or more; the interpreter (interpret=True) any power of two."""
    with pytest.raises(ValueError, match=re.escape(message)):
        Pallas(**{field: value}, interpret=interpret)


def test_interpreted_blocks_below_16_compute_the_same():
    """Blocks of 2 queries and 4 keys (interpret=True): many programs per (batch, head), each walking many key
    blocks with the online softmax and stopping at its diagonal block, give the 16 x 16 blocks' output."""
    assert Pallas(block_q=1, block_k=2, interpret=True).block_q == 1
    small, want = _run("shaw-keys-only-causal-long", np.float64, Pallas(block_q=2, block_k=4, interpret=True))
    big, _ = _run("shaw-keys-only-causal-long", np.float64)
    np.testing.assert_allclose(np.asarray(small), np.asarray(big), rtol=0, atol=1e-13 * np.abs(want).max())


def test_the_program_lowers_to_triton_for_cuda():
    """The same program, not interpreted, lowers through Pallas's Triton backend on this CPU: ``jax.export``
    for the cuda platform gives a module that calls the Triton kernel (every term: Shaw keys and values at
    k = 8, a causal rule, float16, d = 64)."""
    from jax_impl.kernels.pallas import fused_attention

    def f(q, k, v, rel_k, rel_v):
        return fused_attention(
            q, k, v, rel_k, rel_v, None, None, kmax=8, scale=0.125, rel_scale=0.125, causal=True, interpret=False
        )

    shapes = [(2, 4, 64, 64)] * 3 + [(17, 64)] * 2
    args = [jax.ShapeDtypeStruct(s, jnp.float16) for s in shapes]
    triton_call = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    exported = jax.export.export(jax.jit(f), platforms=("cuda",), disabled_checks=[triton_call])(*args)
    text = exported.mlir_module()
    assert "__gpu$xla.gpu.triton" in text and exported.platforms == ("cuda",)
