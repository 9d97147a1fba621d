"""The triton kernel (torch_impl/kernels/fused.py) against the reference: Shaw's key and value terms, RoPE, ALiBi
and T5 in fused Triton programs (forward and backward), run through Triton's interpreter on this CPU
(TRITON_INTERPRET=1) and compiled on CUDA.

Triton is the `triton` extra (Python >= 3.11); `.ci/run` installs it and runs this file; elsewhere these tests
skip with the kernel's reason. Expected values come from numpy_ref (float64).
"""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _fused_calls import ALL_CALLS, draw  # noqa: E402

import numpy_ref  # noqa: E402
import torch_impl  # noqa: E402
from spec import AttentionSpec, Huang, Shaw  # noqa: E402
from torch_impl.kernels import Triton  # noqa: E402
from torch_impl.kernels.fused import BFLOAT16_IN_INTERPRETER, interpreting, triton_unavailable  # noqa: E402

pytestmark = [
    pytest.mark.fused,  # .ci/run's tier: pytest -m fused (not in the default run, for its time)
    pytest.mark.skipif(bool(triton_unavailable()), reason=str(triton_unavailable())),
]


def _rounded(dtype):
    return lambda a: np.asarray(a).astype(dtype).astype(np.float64)


#: Blocks of 16 x 16, so that the calls cross the programs' block boundaries (the interpreter's default is 64).
SMALL = Triton(block_m=16, block_n=16)


def _run(name, dtype, kernel=SMALL):
    spec, params, x, y, kw, want = draw(name, _rounded(dtype))
    t = {n: torch.as_tensor(a.astype(dtype)) for n, a in params.items()}
    tkw = {n: torch.as_tensor(a.astype(dtype) if n == "bias" else a) for n, a in kw.items()}
    got = torch_impl.attention(
        spec, t, torch.as_tensor(x.astype(dtype)), torch.as_tensor(y.astype(dtype)), **tkw, implementation=kernel
    )
    return got, want


@pytest.mark.parametrize("name", ALL_CALLS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 2e-6), (np.float16, 4e-3)])
def test_the_fused_program_computes_the_reference(name, dtype, tol):
    """SHAW-1..4, SCALE-2, SCALE-3, MASK-4, MASK-5, BIAS-1, BIAS-2, CAUSAL-1, WINDOW-1, HEAD-3, HEAD-4, PREC-4:
    the online softmax with the key term's gathered table logits and the value term's per-row weight sums
    (interior rows one key each, the clipped edges summed) equals the reference on inputs of the dtype, to that
    dtype's rounding of the output; a row with no allowed key gives exactly bo. RoPE, ALiBi, T5 and consecutive
    runs of positions (ROPE-1, ALIBI-1, T5-1, POS-1, POS-2) likewise."""
    got, want = _run(name, dtype)
    assert got.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("name", ALL_CALLS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 2e-2)])
def test_the_backward_programs_compute_the_reference_gradients(name, dtype, tol):
    """GRAD-1 through the fused backward: dq, dk, dv from the weights recomputed from each row's log-sum-exp,
    the Shaw tables' gradients (the per-row sums of ds and of the weights), T5's table through the gradient of
    each distance (ds summed along the blocks' diagonals) and the bias input's (summed over its broadcast axes)
    equal numpy_ref's VJP on inputs of the dtype, each to that dtype's rounding of the largest gradient."""
    spec, params, x, y, kw, _, grad_out, want = draw(name, _rounded(dtype), grad=True)
    t = {n: torch.tensor(a.astype(dtype), requires_grad=True) for n, a in params.items()}
    inputs = {n: torch.tensor(a.astype(dtype), requires_grad=True) for n, a in (("query", x), ("key", y), ("value", y))}
    tkw = {
        n: torch.tensor(a.astype(dtype), requires_grad=True) if n == "bias" else torch.as_tensor(a)
        for n, a in kw.items()
    }
    out = torch_impl.attention(spec, t, *inputs.values(), **tkw, implementation=SMALL)
    out.backward(torch.as_tensor(grad_out.astype(dtype)))
    got = {**{n: p.grad for n, p in t.items()}, **{n: a.grad for n, a in inputs.items()}}
    if "bias" in tkw:
        got["bias"] = tkw["bias"].grad
    assert sorted(got) == sorted(want)
    scale = max(np.abs(g).max() for g in want.values())
    for n, g in want.items():
        assert got[n].dtype == torch.from_numpy(np.zeros(1, dtype)).dtype, n
        np.testing.assert_allclose(got[n].double().numpy(), g, rtol=0, atol=tol * scale, err_msg=n)


def test_other_block_sizes_compute_the_same():
    """Triton(block_m, block_n) are knobs of speed only: a 64 x 32 tiling of a causal call equals 16 x 16, and so
    does the default."""
    small, want = _run("shaw-keys-only-causal-long", np.float64)
    big, _ = _run("shaw-keys-only-causal-long", np.float64, Triton(block_m=64, block_n=32))
    default, _ = _run("shaw-keys-only-causal-long", np.float64, Triton())
    np.testing.assert_allclose(big.numpy(), small.numpy(), rtol=0, atol=1e-13 * np.abs(want).max())
    np.testing.assert_allclose(default.numpy(), small.numpy(), rtol=0, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize(
    "spec,kw,message",
    [
        (AttentionSpec(2, 2, relative=Shaw(1, key_side="own")), {}, "triton has no key-side term (SHAW-6)"),
        (
            AttentionSpec(2, 2, relative=Huang(32)),
            {},
            "triton holds each query block's logits against every table row: Huang's 65 rows exceed the 63 it "
            "holds for float64 inputs (MAX_TABLE_ROWS; the tiles and flex kernels take any table)",
        ),
        (
            AttentionSpec(2, 2, relative=Shaw(1)),
            {"q_positions": [0, 2, 3]},
            "triton reads positions that are runs of consecutive integers; q_positions is not (POS-1)",
        ),
        (
            AttentionSpec(2, 2),
            {"q_positions": [255, 0, 1]},  # uint8: 0 - 255 must not wrap around to 1
            "triton reads positions that are runs of consecutive integers; q_positions is not (POS-1)",
        ),
        (AttentionSpec(2, 2, softcap=5.0), {}, "triton has no soft cap (SOFTCAP-1)"),
        (AttentionSpec(2, 2, mask_fill=-1e9), {}, "triton gives disallowed keys weight 0 only, no mask_fill (MASK-6)"),
        (AttentionSpec(2, 2), {"return_weights": True}, "triton does not return the weights (return_weights=True)"),
    ],
    ids=["key-side", "huang-table-rows", "gapped-positions", "uint8-positions", "softcap", "mask-fill", "weights"],
)  # fmt: skip
def test_the_kernel_refuses_what_it_cannot_compute(spec, kw, message):
    """KERN-1: each refusal names what the triton kernel cannot do, and the kernels that can."""
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    positions = kw.get("q_positions")
    if positions is not None:
        positions = torch.tensor(positions, dtype=torch.uint8 if 255 in positions else torch.int64)
    with pytest.raises(ValueError, match=re.escape(f"implementation='triton': cannot run this call: {message}")):
        torch_impl.attention(
            spec,
            params,
            x,
            q_positions=positions,
            return_weights=kw.get("return_weights", False),
            implementation="triton",
        )


@pytest.mark.skipif(not interpreting(), reason="bfloat16 is refused only in Triton's interpreter")
def test_bfloat16_is_refused_in_the_interpreter():
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: torch.as_tensor(a, dtype=torch.bfloat16) for n, a in numpy_ref.init_params(spec, 0).items()}
    with pytest.raises(ValueError, match=re.escape(BFLOAT16_IN_INTERPRETER)):
        torch_impl.attention(spec, params, torch.randn(1, 3, 4, dtype=torch.bfloat16), implementation="triton")


def test_a_float32_table_past_255_rows_is_refused():
    """KERN-1: the table limit of 16-bit and float32 inputs (MAX_TABLE_ROWS), named with the dtype."""
    spec = AttentionSpec(2, 2, relative=Shaw(128, values=False))
    params = {n: torch.as_tensor(a, dtype=torch.float32) for n, a in numpy_ref.init_params(spec, 0).items()}
    message = (
        "triton holds each query block's logits against every table row: Shaw's 257 rows exceed the 255 it holds "
        "for float32 inputs (MAX_TABLE_ROWS; the tiles and flex kernels take any table)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_impl.attention(spec, params, torch.randn(1, 3, 4), implementation="triton")


@pytest.mark.parametrize("name,first,message", [
    ("q_positions", 2**30, "q_positions: expected within +-2**30 (int32 in the programs), got 1073741824"),
    ("k_positions", -(2**30) - 1, "k_positions: expected within +-2**30 (int32 in the programs), got 1073741825"),
])  # fmt: skip
def test_positions_past_int32_are_refused(name, first, message):
    """POS-1: the programs read each batch's first positions as int32; larger ones are an error, not a wrap."""
    spec = AttentionSpec(2, 2, relative=Shaw(1))
    params = {n: torch.as_tensor(a) for n, a in numpy_ref.init_params(spec, 0).items()}
    positions = {name: torch.arange(first, first + 3, dtype=torch.int64)}
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_impl.attention(
            spec, params, torch.randn(1, 3, 4, dtype=torch.float64), **positions, implementation="triton"
        )


@pytest.mark.parametrize("field,value,message", [
    ("block_m", 24, "Triton.block_m: expected a power of two >= 16, got 24"),
    ("block_n", 8, "Triton.block_n: expected an int >= 16, got 8"),
])  # fmt: skip
def test_the_block_sizes_are_checked(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Triton(**{field: value})


COMPILE = """
import json, sys, torch
from torch_impl.kernels import Triton
from torch_impl.kernels.fused import compile_program
arch, dtype, block = int(sys.argv[1]), getattr(torch, sys.argv[2]), int(sys.argv[3])
programs = compile_program(arch, dtype, Triton(block_m=block, block_n=block), d=64, dv=64, max_distance=16)
print(json.dumps({n: {"shared": p.metadata.shared, "cubin": len(p.asm["cubin"])} for n, p in programs.items()}))
"""


@pytest.mark.parametrize(
    "arch,dtype,block",
    [(80, "float16", 64), (80, "float32", 32), (90, "bfloat16", 64), (90, "float32", 64), (90, "float64", 32)],
    ids=["sm80-float16-64", "sm80-float32-32", "sm90-bfloat16-64", "sm90-float32-64", "sm90-float64-32"],
)
def test_the_program_compiles_for_cuda_and_its_shared_memory_fits(arch, dtype, block):
    """The three programs (forward, backward_dq, backward_dkdv) lower for real GPUs on this CPU (Triton's PTX,
    the bundled ptxas's cubin), with every term (Shaw keys and values at k = 16, a distance bias and its
    gradient, mask, bias, causal) at d = dv = 64, and each program's shared memory fits the device's per-block
    limit (A100: 163 KiB, H100/H200: 227 KiB). Run in a process of its own: the interpreter
    (TRITON_INTERPRET=1, set by the tests above) cannot compile."""
    import json
    import os
    import subprocess
    import sys

    from torch_impl.kernels.fused import SHARED_MEMORY_LIMIT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch), dtype, str(block)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["backward_dkdv", "backward_dq", "forward"]
    for name, result in results.items():
        assert result["cubin"] > 0, name
        assert 0 < result["shared"] <= SHARED_MEMORY_LIMIT[arch], (name, result)


IMPORTED_FOR_COMPILING = """
import torch, triton  # what torch.compile and FlexAttention do: Triton imported without its interpreter
import torch_impl
from spec import AttentionSpec
spec = AttentionSpec(num_heads=2, head_dim=2)
params = {n: torch.ones(s, dtype=torch.float32) for n, s in spec.param_shapes().items()}
try:
    torch_impl.attention(spec, params, torch.ones(1, 3, spec.model_dim), implementation="triton")
except RuntimeError as e:
    print(e)
"""


@pytest.mark.skipif(not interpreting(), reason="a CUDA device: Triton compiles there, its interpreter is not used")
def test_triton_imported_without_the_interpreter_is_a_clear_error():
    """On a CPU, a Triton imported before TRITON_INTERPRET=1 (by torch.compile, FlexAttention) cannot interpret the
    kernel: the call says so, where Triton's interpreter would fail inside the program."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", IMPORTED_FOR_COMPILING], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Triton was imported in this process before TRITON_INTERPRET=1 was set" in done.stdout, done.stdout
