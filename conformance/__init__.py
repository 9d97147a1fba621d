"""attnspec's conformance harness: ``python -m conformance run``.

Cases (``catalog``) with stored golden vectors (``goldens/``), budgets from a
naive same-dtype emulation (``naive``, ``tolerance``), checks (``checks``),
adapters (``adapters``), deliberately wrong mutants (``mutants``), the
matrix runner (``runner``) and reports (``report``). PORTING.md explains how
to write an adapter for a new framework.
"""

from .adapters import Adapter, Capabilities, load_adapter
from .catalog import CASES
from .runner import Plan, run

__all__ = ["Adapter", "Capabilities", "load_adapter", "CASES", "Plan", "run"]
