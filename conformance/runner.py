"""Build the matrix (adapter x device x dtype x case), run it, apply expected deviations."""

from __future__ import annotations

import fnmatch
import json
import pathlib
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from .cases import ALL_DTYPES as DTYPE_ORDER
from .catalog import BY_ID, CASES
from .checks import CaseRun, CheckResult, stored_call
from .store import GOLDEN_DIR, load_case, load_manifest

DEVIATIONS_FILE = pathlib.Path(__file__).resolve().parent / "deviations.json"


@dataclass(frozen=True)
class Deviation:
    """A named, expected departure of one adapter from the spec (strict: it must keep failing)."""

    adapter: str
    case: object  # an fnmatch pattern over case ids, or a list of them
    check: str  # fnmatch pattern over check names
    reason: str
    dtype: object = "*"  # an fnmatch pattern over dtype names, or a list of them
    device: str = "*"
    name: str = ""

    def matches(self, r: CheckResult) -> bool:
        cases = [self.case] if isinstance(self.case, str) else self.case
        dtypes = [self.dtype] if isinstance(self.dtype, str) else self.dtype
        return (
            r.adapter == self.adapter
            and any(fnmatch.fnmatchcase(r.case, c) for c in cases)
            and fnmatch.fnmatchcase(r.check, self.check)
            and any(fnmatch.fnmatchcase(r.dtype, t) for t in dtypes)
            and fnmatch.fnmatchcase(r.device, self.device)
        )


def load_deviations(path: pathlib.Path = DEVIATIONS_FILE) -> list:
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    return [Deviation(**d) for d in data["deviations"]]


def apply_deviations(results: list, deviations: list) -> None:
    """Mark the failures a deviation explains; report a deviation that no longer occurs.

    A deviation is one behaviour (say, NaN on fully masked rows) that shows in
    several checks of a case. Its matching failures become ``deviation``; when
    none of its matching checks fails any more for a (case, dtype, device),
    an ``unexpected-pass`` record says so (strict), and the run fails until
    deviations.json is updated.
    """
    groups: dict = {}
    for r in results:
        if r.status not in ("pass", "fail"):
            continue
        for i, d in enumerate(deviations):
            if d.matches(r):
                groups.setdefault((i, r.adapter, r.case, r.dtype, r.device), []).append(r)
                break
    for (i, adapter, case, dtype, device), group in groups.items():
        d = deviations[i]
        failing = [r for r in group if r.status == "fail"]
        for r in failing:
            r.status = "deviation"
            r.message = f"expected deviation {d.name}: {d.reason} ({r.message})"
        if not failing:
            results.append(
                CheckResult(
                    case,
                    adapter,
                    dtype,
                    device,
                    f"deviation/{d.name}",
                    "unexpected-pass",
                    group[0].rules,
                    message=f"expected deviation {d.name} no longer occurs "
                    f"({d.reason}); update conformance/deviations.json",
                )
            )


@dataclass
class Plan:
    adapters: list
    cases: list = field(default_factory=lambda: list(CASES))
    dtypes: Optional[list] = None  # None: every dtype of each case
    devices: Optional[list] = None  # None: every device each adapter has


GPU_ALIASES = {"cuda": "gpu", "gpu": "cuda"}  # torch says cuda, jax says gpu


def matrix(plan: Plan):
    """Yield (adapter, caps, device, dtype, case, skip_reason) for every cell of the matrix."""
    for adapter in plan.adapters:
        reason = adapter.unavailable()
        caps = None if reason else adapter.capabilities()
        devices = plan.devices or (list(caps.devices) if caps else ["cpu"])
        if caps:
            devices = [
                d if d in caps.devices or GPU_ALIASES.get(d) not in caps.devices else GPU_ALIASES[d] for d in devices
            ]
        for device in devices:
            for case in plan.cases:
                for dtype in case.dtypes:
                    if plan.dtypes and dtype not in plan.dtypes:
                        continue
                    skip = reason and f"adapter unavailable: {reason}"
                    if not skip and device not in caps.devices:
                        skip = f"device {device} not available to this adapter (has {', '.join(caps.devices)})"
                    if not skip and dtype not in caps.dtypes:
                        skip = f"dtype {dtype} not supported"
                    if not skip and (device, dtype) in caps.unsupported:
                        skip = f"{dtype} on {device}: {caps.unsupported[device, dtype]}"
                    if not skip and not caps.requires <= case.features():
                        skip = f"certifies only cases that use {', '.join(sorted(caps.requires))}"
                    if not skip and hasattr(adapter, "unsupported_case"):  # what the features cannot say
                        skip = adapter.unsupported_case(case)
                    if not skip:
                        missing = case.features() - caps.features
                        if missing:
                            why = "; ".join(f"{m}: {caps.notes[m]}" for m in sorted(missing) if m in caps.notes)
                            skip = f"needs {', '.join(sorted(missing))}" + (f" ({why})" if why else "")
                    yield adapter, caps, device, dtype, case, skip


def run(
    plan: Plan,
    *,
    directory: pathlib.Path = GOLDEN_DIR,
    deviations: Optional[list] = None,
    progress: Optional[Callable] = None,
    jobs: int = 1,
    names: Optional[list] = None,
) -> list:
    """Every check of the plan, with deviations applied.

    ``jobs > 1`` runs the plan in that many processes, one (adapter, dtype)
    at a time each; ``names`` are the load names of ``plan.adapters`` (what
    ``load_adapter`` takes), which the worker processes rebuild them from.
    With ``names``, an adapter with ``own_process`` runs each of its (dtype)
    shares in a fresh process, whatever ``jobs`` is.
    The results are the same, in the same order, as with one process.
    """
    isolated = any(getattr(a, "own_process", False) for a in plan.adapters)
    if (jobs > 1 or isolated) and names is not None and all(c.id in BY_ID for c in plan.cases):
        results = _run_parallel(plan, names, directory, progress, jobs)
        apply_deviations(results, load_deviations() if deviations is None else deviations)
        return results
    results = _run_cells(plan, directory, progress)
    apply_deviations(results, load_deviations() if deviations is None else deviations)
    return results


def _run_cells(plan: Plan, directory: pathlib.Path, progress: Optional[Callable], by_case: bool = False) -> list:
    """The checks of every cell, in matrix order, or with ``by_case`` every adapter of a case before the
    next case (adapters that share compiled programs then find them); no deviations applied."""
    manifest = load_manifest(directory)
    cells = list(matrix(plan))
    if by_case:
        order = {c.id: n for n, c in enumerate(plan.cases)}
        # device, case; first the adapters whose programs others share (whose cells they may run as)
        shared = {n for a in plan.adapters for n in getattr(a, "shares_programs_with", ())}
        cells.sort(key=lambda cell: (cell[2], order[cell[4].id], cell[0].name not in shared))
    loaded: dict = {}
    results: list = []
    envs = {}
    previous, used = None, []
    ran: dict = {}  # (adapter name, dtype, device) -> the checks of its cell of the current case
    for adapter, caps, device, dtype, case, skip in cells:
        if previous is not None and previous != case.id:
            for a in used:
                a.release()  # the previous case's compiled programs are not needed again
            used, ran = [], {}
        previous = case.id
        if progress:
            progress(adapter.name, device, dtype, case.id)
        if skip:
            results.append(CheckResult(case.id, adapter.name, dtype, device, "*", "skip", case.all_rules, message=skip))
            continue
        if adapter not in used:  # an adapter that only skipped has nothing to release (its framework may be absent)
            used.append(adapter)
        if case.id not in manifest["cases"]:
            results.append(
                CheckResult(
                    case.id,
                    adapter.name,
                    dtype,
                    device,
                    "*",
                    "fail",
                    case.all_rules,
                    message="case missing from the goldens; run `python -m conformance generate`",
                )
            )
            continue
        entry = manifest["cases"][case.id]
        if case.id not in loaded:
            loaded.clear()  # one case's tensors at a time
            loaded[case.id] = load_case(case.id, entry, directory)
        if adapter.name not in envs:
            envs[adapter.name] = adapter.environment()
        same = _ran_as(adapter, case, loaded[case.id], dtype, device, ran)
        if same is not None:
            name, checks = same
            note = f"the cell of {name}: the same kernel and compiled program"
            for r in checks:
                message = f"{r.message} ({note})" if r.message else note
                results.append(
                    replace(r, adapter=adapter.name, message=message, environment=envs[adapter.name], seconds=None)
                )
            continue
        start = time.perf_counter()
        cell = CaseRun(case, entry, loaded[case.id], adapter, caps, dtype, device).run()
        for r in cell:
            r.environment = envs[adapter.name]
        if cell:
            cell[0].seconds = time.perf_counter() - start
        ran[adapter.name, dtype, device] = cell
        results.extend(cell)
    for a in used:
        a.release()
    return results


def _ran_as(adapter, case, tensors: dict, dtype: str, device: str, ran: dict):
    """(name, checks) of the cell already run by the adapter ``adapter`` runs as for this case (``runs_as``),
    or None: it runs its own cell (no such hook, an error case, no such adapter in this process, or that
    cell skipped)."""
    if not hasattr(adapter, "runs_as") or not getattr(adapter, "shares_programs_with", ()) or case.expect_error:
        return None
    _, inputs, _ = stored_call(case, tensors, dtype)
    name = adapter.runs_as(case.spec, inputs)
    checks = ran.get((name, dtype, device))
    return None if checks is None or name == adapter.name else (name, checks)


def _run_unit(names: tuple, case_ids: list, dtype: str, devices, directory: str, queue) -> list:
    """One worker's share: every case of one adapter (or of adapters sharing programs) in one dtype."""
    from .adapters import load_adapter

    plan = Plan([load_adapter(n) for n in names], [BY_ID[i] for i in case_ids], [dtype], devices)
    step = None if queue is None else (lambda *cell: queue.put(cell))
    return _run_cells(plan, pathlib.Path(directory), step, by_case=len(names) > 1)


def _units(plan: Plan, names: list) -> list:
    """Groups of adapter indices that run in one process: an adapter with the adapters it shares compiled
    programs with (``shares_programs_with``), each other adapter alone; in plan order."""
    index = {n: i for i, n in enumerate(names)}
    groups, placed = [], set()
    for i, adapter in enumerate(plan.adapters):
        if i in placed:
            continue
        shared = [index[n] for n in getattr(adapter, "shares_programs_with", ()) if n in index]
        group = sorted({i, *(j for j in shared if j not in placed)})
        placed.update(group)
        groups.append(tuple(group))
    return groups


def _threads_per_worker(threads: int) -> None:
    """Worker set-up, before any framework loads: ``threads`` intra-op threads (OMP_NUM_THREADS, which
    PyTorch's CPU ops read), unless the environment sets a number.

    ``jobs`` workers with a thread per core each would put ``jobs`` times the cores' threads on the cores;
    the small operations of the cases then spend more time waiting for each other's threads than
    computing (the tiny-tile torch checks took over twice the CPU time with 2 workers on 2 cores).
    """
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def _run_parallel(plan: Plan, names: list, directory: pathlib.Path, progress, jobs: int) -> list:
    """The cells of the plan over ``jobs`` processes; the results in matrix order."""
    import concurrent.futures
    import contextlib
    import multiprocessing
    import os
    import queue as queue_module
    import sys

    from .adapters import _jax

    if plan.cases:  # fail here, in one line, when the goldens cannot be read (a missing package)
        manifest = load_manifest(directory)
        if plan.cases[0].id in manifest["cases"]:
            load_case(plan.cases[0].id, manifest["cases"][plan.cases[0].id], directory)
    os.environ.setdefault(_jax.CACHE_ENV, _jax._compilation_cache())  # one XLA cache for every worker
    dtypes = plan.dtypes or sorted({d for c in plan.cases for d in c.dtypes}, key=DTYPE_ORDER.index)
    units = [(group, dtype) for group in _units(plan, names) for dtype in dtypes]
    own = {u for u in units if any(getattr(plan.adapters[i], "own_process", False) for i in u[0])}
    context = multiprocessing.get_context("spawn")  # JAX and PyTorch hold threads: no fork
    manager = context.Manager() if progress else None
    q = manager.Queue() if manager else None
    ids = [c.id for c in plan.cases]
    out: dict = {}
    try:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # 3.10: one unit each anyway
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(
                concurrent.futures.ProcessPoolExecutor(
                    jobs, mp_context=context, initializer=_threads_per_worker, initargs=(threads,)
                )
            )
            # the own_process units each in a process of its own: one at a time beside the pool's work, ``jobs``
            # at a time when they are all there is
            alone = stack.enter_context(
                concurrent.futures.ProcessPoolExecutor(
                    jobs if len(own) == len(units) else 1, mp_context=context, initializer=_threads_per_worker,
                    initargs=(threads,), **fresh,
                )
            ) if own and fresh else None  # fmt: skip

            def submit(unit):
                group, dtype = unit
                executor = pool if unit not in own else alone or stack.enter_context(
                    concurrent.futures.ProcessPoolExecutor(
                        1, mp_context=context, initializer=_threads_per_worker, initargs=(threads,)
                    )
                )  # fmt: skip
                return executor.submit(
                    _run_unit, tuple(names[i] for i in group), ids, dtype, plan.devices, str(directory), q
                )

            futures = {submit(unit): unit for unit in units}
            pending = set(futures)
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.2)
                while q is not None:
                    try:
                        progress(*q.get_nowait())
                    except queue_module.Empty:
                        break
                for f in done:
                    out[futures[f]] = f.result()
    finally:
        if manager is not None:
            manager.shutdown()
    case_order = {i: n for n, i in enumerate(ids)}
    results = [r for group, dtype in units for r in out[group, dtype]]
    adapter_of = {a.name: i for i, a in enumerate(plan.adapters)}
    # matrix order: adapter, device, case, dtype (the sort is stable within a cell)
    results.sort(key=lambda r: (adapter_of.get(r.adapter, 0), r.device, case_order[r.case], DTYPE_ORDER.index(r.dtype)))
    return results
