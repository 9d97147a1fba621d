import json
import os
import pathlib
import shutil
import tempfile

from hypothesis import HealthCheck, settings

# The reference is float64 NumPy: examples are fast but their time varies with
# the drawn sizes, so no per-example deadline. ATTNSPEC_HYPOTHESIS_EXAMPLES
# raises the example count for a deeper local run.
settings.register_profile(
    "attnspec",
    deadline=None,
    max_examples=int(os.environ.get("ATTNSPEC_HYPOTHESIS_EXAMPLES", "300")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("attnspec")

# pytest-xdist runs one worker per core: each gets its share of the cores as
# intra-op threads (OMP_NUM_THREADS, read by PyTorch's CPU ops when it loads),
# unless the environment sets a number. A thread per core in every worker
# oversubscribes the cores, and the many small operations of the tests then
# mostly wait for each other's threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

# The mutant kill table is gathered in a temporary folder (one JSON file per
# mutant) rather than in pytest's cache, so that it works with xdist workers
# and under `-p no:cacheprovider` (read-only checkouts). The controller makes
# the folder before the workers start; they inherit its path.
KILLS_ENV = "ATTNSPEC_MUTANT_KILLS_DIR"


# XLA's compilation cache for the JAX adapters, one folder for the whole session
# so that xdist workers share it (conformance/adapters/_jax.py; made fresh here).
JAX_CACHE_ENV = "ATTNSPEC_JAX_CACHE_DIR"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        folder = tempfile.mkdtemp(prefix="attnspec-kills-")
        os.environ[KILLS_ENV] = folder
        config._attnspec_kills = folder
        config._attnspec_jax_cache = os.environ[JAX_CACHE_ENV] = tempfile.mkdtemp(prefix="attnspec-xla-")


def pytest_unconfigure(config):
    folder = getattr(config, "_attnspec_jax_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def record_kill(name: str, rule: str, killed_by: list) -> None:
    """Record which (case, check) pairs claiming ``rule`` failed for mutant ``name``."""
    folder = os.environ.get(KILLS_ENV)
    if folder:
        (pathlib.Path(folder) / f"{name}.json").write_text(json.dumps([rule, killed_by]), encoding="utf-8")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the mutant kill table (mutant, its rule, the checks that claim it and failed)."""
    folder = getattr(config, "_attnspec_kills", None)
    if folder is None:
        return
    files = sorted(pathlib.Path(folder).glob("*.json"))
    if files:
        terminalreporter.section("conformance mutants: each must be killed by a check claiming its rule")
        for path in files:
            rule, killed_by = json.loads(path.read_text(encoding="utf-8"))
            state = (
                f"killed by {rule} in {len(killed_by):2d} checks"
                if killed_by
                else f"SURVIVED (no failing {rule} check)"
            )
            first = f" (e.g. {killed_by[0][0]} [{killed_by[0][1]}])" if killed_by else ""
            terminalreporter.write_line(f"{path.stem:34s} {state}{first}")
    shutil.rmtree(folder, ignore_errors=True)
