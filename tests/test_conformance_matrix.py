"""The conformance matrix under pytest: one test per (adapter, device, dtype, case).

A test fails when any check of its cell fails (expected deviations listed in
conformance/deviations.json are allowed, strictly); a cell the adapter
cannot run is skipped with the reason the harness gives.

Every built-in adapter runs here, with these exceptions that keep the suite
under ten minutes on 2 cores (XLA compiles about 0.8 s per program, one per
case and dtype); ``.ci/run`` runs them in full through ``python -m
conformance run``, and so does the quick start's first command (all but
``jax:xla``, which it runs with ``--all``):

- ``jax``, jax_impl's automatic kernel choice: for every case it resolves
  to exactly the kernel object ``jax:tiles`` pins
  (``test_jax_automatic_choice_is_the_tiles_kernel`` checks this case by
  case), so its cells would run the same programs again;
- ``jax:xla``, the readable baseline (tests/test_jax_kernels.py checks it
  against the reference here, as every kernel), and the 16-bit cells of
  ``jax:tiles`` (its float64 and float32 cells run here; the 16-bit
  arithmetic of jax_impl is tested here by tests/test_jax_impl.py in every
  dtype, and cell by cell by ``.ci/run``);
- the 16-bit cells of the JAX peers ``jax-nn`` and ``flax-mha`` (their
  float64 and float32 cells run here; XLA:CPU compiles a 16-bit program
  about 1.75 times as long, 2.3-3.6 s a cell);
- ``torch:flex``, FlexAttention called eagerly on the CPU (forward only
  there): tests/test_torch_kernels.py checks the kernel against the
  reference in float64, float32 and bfloat16 and runs the adapter on cells
  of its own;
- the outside RoPE and position-bias adapters (``hf-*``,
  ``rotary-embedding-torch``, ``torchtune-rope``, ``xt-*``,
  ``keras-hub-*``, ``gemma-rope``, ``bloom-alibi``, ``mpt-alibi``,
  ``falcon-alibi``, ``timm-window-attention``, ``t2t-*``): their own test
  files here check each library against the reference, and ``.ci/run`` runs
  their cells (timm, transformers 4.x for ``hf-bert-relative-key``, and
  tensor2tensor in environments of their own).
"""

import pytest

from conformance import runner
from conformance.adapters import BUILTIN, load_adapter
from conformance.catalog import CASES
from conformance.checks import CaseRun
from conformance.store import load_case, load_manifest

MANIFEST = load_manifest()
DEVIATIONS = runner.load_deviations()
#: adapter -> the dtypes whose cells only `python -m conformance run` (and .ci/run) covers
ALL = ("float64", "float32", "bfloat16", "float16")
CLI_ONLY = {
    "jax": ALL,
    "jax:xla": ALL,
    # jax_impl's automatic kernel: its cells compile one XLA program each (about 3 minutes of this run); .ci/run
    # runs them in its conformance run, and tests/test_jax_kernels.py checks the kernel against the reference here
    "jax:tiles": ALL,
    "jax-nn": ("bfloat16", "float16"),
    "flax-mha": ("bfloat16", "float16"),
    "torch:flex": ALL,
    # the reference over blocks of keys: tests/test_blockwise.py checks it against the reference here
    "numpy:blockwise": ALL,
    # Triton's interpreter: installed and run by .ci/run (tests/test_torch_triton.py checks the kernel there)
    "torch:triton": ALL,
    # Pallas's interpret mode: tests/test_jax_pallas.py checks the kernel here
    "jax:pallas": ALL,
    # the rings run in processes of their own (8 host devices; 4 gloo ranks): tests/test_jax_ring.py and
    # tests/test_torch_ring.py check them against the reference (pytest -m ring)
    "jax:ring": ALL,
    "torch:ring": ALL,
    # PyTorch's context parallelism on 2 gloo processes: tests/test_torch_context_parallel.py checks it (pytest -m ring)
    "torch-cp-flex": ALL,
    # ringattention's JAX ring on 8 host devices: tests/test_ringattention.py checks it (pytest -m ring)
    "ringattention": ALL,
    "torch-cp-flex-balanced": ALL,
    # the outside RoPE and bias adapters: each library's own tests here (tests/test_*rope*.py,
    # tests/test_*bias_libs.py) check it against the reference; its cells run in `python -m conformance run`
    # (keras-hub and Gemma are installed by .ci/run alone)
    **dict.fromkeys(
        [
            "hf-llama-rope",
            "hf-llama-attention",
            "hf-gptneox-rope",
            "hf-gptj-rope",
            "rotary-embedding-torch",
            "torchtune-rope",
            "xt-rope",
            "keras-hub-rope",
            "gemma-rope",
            "xt-alibi",
            "xt-t5",
            "xt-attend",
            "hf-t5-bias",
            "bloom-alibi",
            "mpt-alibi",
            "falcon-alibi",
            "hf-swin-attention",
            "timm-window-attention",
            "hf-bert-relative-key",
            "hf-esm-relative-key",
            "hf-bert-relative-key-query",
            "hf-esm-relative-key-query",
            "hf-t5-attention",
            "keras-hub-alibi",
            "t2t-shaw",
            "t2t-huang",
            "hf-albert-relative-key",
            "hf-albert-relative-key-query",
            "hf-wav2vec2-bert-relative-key",
            "hf-deberta-v2-attention",
        ],
        ALL,
    ),
}
ADAPTERS = {name: load_adapter(name) for name in BUILTIN if len(CLI_ONLY.get(name, ())) < 4}
CELLS = [c for c in runner.matrix(runner.Plan(list(ADAPTERS.values()))) if c[3] not in CLI_ONLY.get(c[0].name, ())]


def _id(cell):
    adapter, _, device, dtype, case, _ = cell
    return f"{adapter.name}-{device}-{dtype}-{case.id}"


@pytest.mark.parametrize("cell", CELLS, ids=[_id(c) for c in CELLS])
def test_cell(cell):
    adapter, caps, device, dtype, case, skip = cell
    if skip:
        pytest.skip(skip)
    entry = MANIFEST["cases"][case.id]
    try:
        results = CaseRun(case, entry, load_case(case.id, entry), adapter, caps, dtype, device).run()
    finally:
        adapter.release()  # one cell's compiled programs are not needed again (memory maps add up)
    runner.apply_deviations(results, DEVIATIONS)
    assert results, "a runnable cell must produce checks"
    failed = [f"[{r.check}] {r.message}" for r in results if r.failed]
    assert not failed, "\n".join(failed)


def test_jax_automatic_choice_is_the_tiles_kernel():
    """KERN-1: implementation=None picks Tiles() for every case and call form the matrix makes."""
    pytest.importorskip("jax")
    from jax_impl import kernels

    for case in CASES:
        if case.expect_error:
            continue
        f = case.features()
        for weights in (False, True):
            call = kernels.Call(
                case.dims.B,
                case.dims.Lq,
                case.dims.Lk,
                default_positions="positions" not in f,
                mask="mask" in f,
                bias="bias" in f,
                dropout_keep="dropout-keep" in f,
                return_weights=weights,
            )
            assert kernels.resolve(None, case.spec, call) == kernels.resolve("tiles", case.spec, call), case.id


def test_every_cell_left_to_the_cli_runs_in_ci():
    """Each (adapter, dtype) of CLI_ONLY is named by a ``python -m conformance run`` line of .ci/run (no
    ``--dtype`` there: every dtype), so leaving a cell out of pytest never leaves it out of CI."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / ".ci" / "run").read_text(encoding="utf-8")
    commands = [c for c in text.replace("\\\n", " ").splitlines() if "-m conformance run" in c]
    covered = set()
    for command in commands:
        dtypes = re.findall(r"--dtype (\S+)", command) or ALL
        covered |= {(a, d) for a in re.findall(r"--adapter (\S+)", command) for d in dtypes}
    missing = sorted((a, d) for a, dtypes in CLI_ONLY.items() for d in dtypes if (a, d) not in covered)
    assert not missing, f"cells in neither pytest nor .ci/run: {missing}"
