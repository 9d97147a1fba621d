"""Build the matrix (adapter x device x dtype x case), run it, apply expected deviations."""

from __future__ import annotations

import fnmatch
import json
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Optional

from .catalog import CASES
from .checks import CaseRun, CheckResult
from .store import GOLDEN_DIR, load_case, load_manifest

DEVIATIONS_FILE = pathlib.Path(__file__).resolve().parent / "deviations.json"


@dataclass(frozen=True)
class Deviation:
    """A named, expected departure of one adapter from the spec (strict: it must keep failing)."""

    adapter: str
    case: object  # an fnmatch pattern over case ids, or a list of them
    check: str  # fnmatch pattern over check names
    reason: str
    dtype: str = "*"
    device: str = "*"
    name: str = ""

    def matches(self, r: CheckResult) -> bool:
        cases = [self.case] if isinstance(self.case, str) else self.case
        return (
            r.adapter == self.adapter
            and any(fnmatch.fnmatchcase(r.case, c) for c in cases)
            and fnmatch.fnmatchcase(r.check, self.check)
            and fnmatch.fnmatchcase(r.dtype, self.dtype)
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
) -> list:
    """Every check of the plan, with deviations applied."""
    manifest = load_manifest(directory)
    cells = list(matrix(plan))
    loaded: dict = {}
    results: list = []
    envs = {}
    previous = None
    for adapter, caps, device, dtype, case, skip in cells:
        if previous is not None and previous != (adapter, case.id):
            previous[0].release()  # the previous case's compiled programs are not needed again
        previous = (adapter, case.id)
        if progress:
            progress(adapter.name, device, dtype, case.id)
        if skip:
            results.append(CheckResult(case.id, adapter.name, dtype, device, "*", "skip", case.all_rules, message=skip))
            continue
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
        for r in CaseRun(case, entry, loaded[case.id], adapter, caps, dtype, device).run():
            r.environment = envs[adapter.name]
            results.append(r)
    if previous is not None:
        previous[0].release()
    apply_deviations(results, load_deviations() if deviations is None else deviations)
    return results
