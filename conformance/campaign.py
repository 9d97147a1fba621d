"""Mutation campaign: which wrong versions of ``numpy_ref`` (and of ``torch_impl``'s kernels) does the catalog miss?

``python -m conformance campaign`` parses every file of ``numpy_ref/`` (but
``definition.py`` and ``schemes/_literal.py``, the loop-level definition that
only the tests use), makes one AST mutant per operator application, and runs
the conformance harness against each: the ``numpy`` adapter on cpu (and
``numpy:blockwise``, the reference over blocks of keys, BLOCK-1..4), every
case of ``conformance.catalog.CASES`` in its widest stored dtype (float64;
float32 for the cases stored in float32 only, whose inputs the reference
still computes on in float64, PREC-1; the report names cases with neither).
Each mutant carries the rule ids its function's docstring names (else its
class's, else its module's): the rules its code implements. A mutant that a
check claiming one of those rules fails on is *killed*; one that only checks
claiming none of them fail on is *killed-unclaimed* (the catalog lacks the
claim, or the docstring the rule: a failure of the campaign, like a
survivor); one that passes everything *survived*: either it cannot change
any result the spec defines (then ``campaign_data/equivalent.json`` says
why, and it counts as *equivalent*) or the catalog lacks an input that tells
it apart. The report lands in ``campaign_data/report.json`` and
``campaign_data/REPORT.md``; the exit status is 1 while any survivor has no
argument, any mutant is killed-unclaimed or an unreached function has no
reason in ``unreached.json`` (``--allow-survivors``: 0 anyway).

Packages and kernels (``PACKAGES``; the command line picks them):

- ``numpy_ref`` (the default; ``--package numpy_ref``, ``--kernel numpy``),
  as above;
- ``torch_impl`` (``--package torch_impl``; one kernel: ``--kernel
  torch:eager``, ``--kernel torch:tiles``, ``--kernel torch:sdpa``,
  ``--kernel torch:flex``, repeatable): the four kernels' own files
  (``kernels/eager.py``, ``kernels/tiles.py``, ``kernels/sdpa.py``,
  ``kernels/flex.py``) and the code they share (``_core.py``,
  ``_checks.py``, ``_workspace.py``, ``functional.py``,
  ``kernels/__init__.py``, ``kernels/_base.py``, ``schemes/*.py``), run
  through the adapters ``torch:eager``, ``torch:sdpa``, ``torch:flex``
  (FlexAttention called eagerly and outside Dynamo, ``_torch_child``;
  forward cells: PyTorch has no FlexAttention backward on a CPU), and
  ``torch:tiles-small`` and ``torch:tiles`` (the tiles kernel) on cpu, same
  cases and dtypes. ``torch:tiles-small``
  (``conformance.adapters.torch_impl_adapter.TorchSmallTilesAdapter``) is
  the tiles kernel with its knobs sized to each call so that it runs a few
  query tiles and (batch, head) groups, and causal tiles skip keys: with the
  default knobs a catalog case fits one tile, and a kernel that is right on
  its first tile would pass (``torch:tiles`` keeps that one-tile path
  judged). Its arguments and reasons live in
  ``campaign_data/torch_impl/`` (``equivalent.json``, ``unreached.json``),
  its reports beside them;
- ``--all``: every package, one after the other.

A kernel's own files run through its adapter only; a shared file through
every adapter of the kernels chosen. Without ``--package``, ``--kernel`` or
``--all``, a ``--target``, ``--mutant`` or ``--show`` written with a
package's prefix (``torch_impl/kernels/tiles.py``) chooses that package.

Operators (the ``<operator>`` part of a mutant id):

=============== ==================================================================================
arith           ``+ <-> -``, ``* <-> /``, ``// -> /``, ``% -> //``, ``** -> *`` (also augmented ``x += y``)
bitwise         ``& <-> |``, ``^ -> |`` (boolean masks: ``allowed &= mask``)
operand-swap    ``a - b -> b - a``, ``a / b -> b / a``, ``a @ b -> b @ a``
operand-drop    ``a + b -> a`` and ``-> b``; likewise for ``-``, ``&``, ``|``
compare         ``< <-> <=``, ``> <-> >=``, ``== <-> !=``, ``is <-> is not``, ``in <-> not in``
boolop          ``and <-> or``
not-removal     ``not x -> x``
invert-removal  ``~x -> x``
neg-removal     ``-x -> x`` where x is not a number literal (literals belong to the constant operators)
cond-negate     the test of ``if``, ``... if ... else ...``, ``while`` and comprehension filters:
                ``c -> not c`` (not for ``not ...`` or a single ``is``/``==``/``in`` test: compare covers those)
int-const       integer literal ``n -> n + 1`` and ``n -> n - 1`` (so 0 -> 1, -1 and 1 -> 2, 0)
float-const     float literal ``c -> -c`` and ``c -> 2c``; ``0.0 -> 1.0``
axis            an integer given as ``axis=``, ``axis1=``, ``axis2=``, ``axes=``, ``source=``,
                ``destination=`` or to ``swapaxes``/``moveaxis``/``expand_dims``/``squeeze``:
                ``n -> n + 1, n - 1`` (``axis=-1 -> 0, -2``)
index           an integer subscript: ``x[..., 0] -> x[..., 1], x[..., -1]``, ``shape[-2] -> shape[-1]``
slice           a slice bound ``b -> b + 1, b - 1`` (a bound written ``e +/- literal`` is left to int-const)
perm-swap       two entries of an integer tuple/list literal swapped (not a reduction's ``axis=``
                tuple, whose order does not matter), or two integer arguments of ``.transpose(...)``
func-swap       numpy functions and ndarray methods: max <-> min, amax <-> amin, maximum <-> minimum,
                argmax <-> argmin, sum -> mean, any <-> all, logical_and <-> logical_or, tril <-> triu,
                zeros <-> ones, isfinite -> isnan, isnan -> isinf; builtins min <-> max, any <-> all
call-drop       ``f(x) -> x`` for np.abs, abs, np.asarray, np.array, np.ascontiguousarray;
                ``x.copy() -> x``, ``x.astype(t) -> x``
where-swap      ``np.where(c, a, b) -> np.where(c, b, a)``
keepdims        ``keepdims=True -> keepdims=False``
none-move       a broadcasting ``None`` in a subscript moves one place: ``x[:, None] -> x[None, :]``
stmt-drop       a statement becomes ``pass``: an assignment to a subscript or attribute
                (``out[...] = g``), an augmented assignment (``allowed &= mask``), a re-assignment of a
                name the function already bound (``key = np.where(dead, 0.0, key)``), a call statement,
                a ``raise``
=============== ==================================================================================

In torch_impl the module-level operators read ``torch.<name>`` for ``np.<name>``
(func-swap, call-drop, where-swap), with ``zeros_like <-> ones_like`` among the
swaps; method swaps add ``amax <-> amin``, ``tril <-> triu`` and ``tril_ <->
triu_``; call-drop takes ``torch.abs`` and the methods ``clone``,
``contiguous``, ``detach``; axis takes the keywords ``dim``, ``dims``,
``dim0``, ``dim1``, ``source``, ``destination`` and the integer arguments of
``unsqueeze``, ``squeeze``, ``transpose`` (two axes in torch), ``swapaxes``,
``movedim``, ``flip``; perm-swap takes ``permute``; keepdims is ``keepdim``
(``Dialect``, ``TORCH_DIALECT``). Casts (``.to(dtype)``) are not dropped:
the campaign's float64 cells could not tell them apart (PREC-4).

Never mutated: docstrings, string constants, f-strings, the arguments of a
``raise`` (exception messages) and of ``assert``'s message, annotations and
decorators. Conditions that guard a ``raise`` are mutated (the catalog has
error cases), and so is the ``raise`` itself (stmt-drop).

Mutant ids are ``<path relative to numpy_ref>:<function qualname or <module>>:<operator>:<k>``,
k counting that operator's mutants within that function in source order;
each mutant records its line, column, the original and the mutated node
(``ast.unparse``). Another package's ids start with its name:
``torch_impl/kernels/tiles.py:Tiles.grid:arith:0`` (numpy_ref's ids
predate the other packages, and equivalent.json keys on them), and so do
the keys of its unreached.json (``torch_impl/kernels/tiles.py:_tile``).

Reachability: the catalog first runs once on the unmutated reference under a
line tracer (``sys.settrace``, limited to the files in scope). A mutant whose
node lies on lines that run never executes is *unreached* (a coverage finding
of the catalog, reported with its function) and is not run. In torch_impl
the tracer also records each bytecode instruction that runs, per (case,
adapter) cell (``_Reach``): a mutant runs only in the cells whose unmutated
run evaluated its node (an instruction of the node's source span ran), and
one whose node no cell evaluated is unreached, though its line ran (the
16-bit branch of ``x if same_dtype else y`` in float64 cells). A node with
no instruction of its own, a default value and module-level code count by
their lines; code run while the package imports counts for every cell, but
a module constant (``NAME = value``, the name mentioned in no other module
of the package nor in the conformance code) counts by the cells that read
its name.

Runner (POSIX only: it forks). The parent loads the manifest and every
case's stored tensors once; each mutant runs in a forked child that drops
the package (``numpy_ref``), its submodules and the conformance modules holding references
to it from ``sys.modules``, imports the package afresh with the one mutated
module served from its compiled AST by a meta-path finder, builds fresh
adapters (``NumpyRefAdapter`` and ``NumpyBlockwiseAdapter``) and runs the cases (each through each), stopping at the
first failing check. For torch_impl the parent imports torch (and
the torch modules that torch_impl and the first backward import) before it
forks, so that no child pays for the imports,
but runs no operation: a thread pool started in the parent would not
survive the fork. Each child sets ``torch.set_num_threads(1)`` first (two
children share two cores).
A failing check, an exception (escaping a case, or caught by the checks
that fail only on one: ``forward``, ``gradients``), an import error or a
crash of the child kill the mutant (the report says which; a call the spec
defines that raises breaks every rule, so these are kills by rule); a child that runs past
``--timeout`` seconds is killed by timeout. The cases run in adaptive order:
the cases naming one of the mutant's rules first, each group by the mutants
it killed (most first; ties in catalog order), so a killed mutant costs
milliseconds; after a failure that claims none of its rules the search for a
claiming one goes on through every case. Mutant i orders the cases by the kills of
mutants 0 .. i - WINDOW only, so the report does not depend on ``--jobs``.
"""

from __future__ import annotations

import ast
import copy
import difflib
import fnmatch
import gc
import importlib.abc
import importlib.util
import json
import os
import pathlib
import re
import selectors
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from .checks import CaseRun, CheckResult

HERE = pathlib.Path(__file__).resolve().parent
DATA_DIR = HERE / "campaign_data"
EQUIVALENT_FILE = DATA_DIR / "equivalent.json"
#: "<file>:<function>" -> why the catalog need not reach that code (shown in the report's unreached section).
UNREACHED_FILE = DATA_DIR / "unreached.json"
PACKAGE = "numpy_ref"
EXCLUDED = ("definition.py", "schemes/_literal.py")
#: killed: a check claiming one of the mutant's rules failed; killed-unclaimed: only checks claiming none of them did.
STATUSES = ("killed", "killed-unclaimed", "timeout", "survived", "equivalent", "unreached", "error-on-build")
DEVICE = "cpu"
#: Each case runs in the first of these dtypes it is stored in (the reference computes in float64 either way).
DTYPES = ("float64", "float32")
#: Mutant i orders the cases by the kills of mutants 0 .. i - WINDOW: the same order for any --jobs <= WINDOW.
WINDOW = 16
DEFAULT_JOBS = 2
DEFAULT_TIMEOUT = 30.0
#: A rule id as prose names it (only the ids the spec declares count: spec.rule_ids()).
RULE_MENTION = re.compile(r"\b[A-Z][A-Z0-9]*-\d+\b")
#: The checks that fail only when the implementation raises (conformance/checks.py): a kill by rule, whatever the
#: check claims, since a call of the spec that raises breaks every rule, the mutant's too.
RAISING_CHECKS = frozenset({"forward", "gradients"})
#: Address space a child may add to what it inherited before a runaway allocation fails.
CHILD_EXTRA_MEMORY = 4 << 30
MESSAGE_CHARS = 300


def cell_dtype(case) -> Optional[str]:
    """The dtype a case runs in: the first of DTYPES it is stored in, or None."""
    return next((d for d in DTYPES if d in case.dtypes), None)


class CampaignArgumentError(ValueError):
    """A bad command-line argument of the campaign ("<arg>: expected <what>, got <value>")."""


def _bad(arg: str, expected: str, got) -> CampaignArgumentError:
    return CampaignArgumentError(f"{arg}: expected {expected}, got {got}")


# =================================================================== mutants
@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to numpy_ref/, posix
    function: str  # qualname, or <module>
    operator: str
    line: int
    col: int
    end_line: int
    original: str
    mutated: str
    path: tuple = field(repr=False)  # (field, index or None) steps from the module to the changed node
    replacement: object = field(repr=False, compare=False)  # the new node; None: the statement becomes `pass`
    reach: tuple = field(repr=False, default=())  # lines (first, last): the mutant runs when one of them does
    rules: tuple = ()  # the rule ids its function's docstring names (else its class's, else its module's)
    package: str = PACKAGE  # the package ``file`` lies in
    end_col: int = field(repr=False, default=-1)  # the node's end column (UTF-8 bytes, as ``ast`` counts)

    @property
    def module(self) -> str:
        return module_name(self.file, self.package)

    @property
    def where(self) -> str:
        return f"{self.package}/{self.file}:{self.line}"

    @property
    def id_file(self) -> str:
        """The file as the id names it: ``kernels/tiles.py`` of torch_impl is ``torch_impl/kernels/tiles.py``."""
        return PACKAGES[self.package].id_prefix + self.file


AXIS_KEYWORDS = frozenset({"axis", "axis1", "axis2", "axes", "source", "destination"})
ORDERLESS_AXIS_KEYWORDS = frozenset({"axis"})  # a reduction over (0, 1) is a reduction over (1, 0)
AXIS_METHODS = frozenset({"swapaxes", "moveaxis", "expand_dims", "squeeze"})
PERM_METHODS = frozenset({"transpose", "permute"})
ARITH = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
BITWISE = {ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr}
SWAP_OPERANDS = (ast.Sub, ast.Div, ast.MatMult)
DROP_OPERANDS = (ast.Add, ast.Sub, ast.BitAnd, ast.BitOr)
COMPARE = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
NEGATION_COVERED = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)
NP_SWAPS = {
    "max": "min",
    "min": "max",
    "amax": "amin",
    "amin": "amax",
    "maximum": "minimum",
    "minimum": "maximum",
    "argmax": "argmin",
    "argmin": "argmax",
    "sum": "mean",
    "any": "all",
    "all": "any",
    "logical_and": "logical_or",
    "logical_or": "logical_and",
    "tril": "triu",
    "triu": "tril",
    "zeros": "ones",
    "ones": "zeros",
    "isfinite": "isnan",
    "isnan": "isinf",
}
METHOD_SWAPS = {k: NP_SWAPS[k] for k in ("max", "min", "argmax", "argmin", "sum", "any", "all")}
BUILTIN_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}
NP_UNWRAP = frozenset({"abs", "asarray", "array", "ascontiguousarray"})
BUILTIN_UNWRAP = frozenset({"abs"})
METHOD_UNWRAP = frozenset({"copy", "astype"})


# ================================================================== packages
@dataclass(frozen=True)
class Dialect:
    """The names the operators recognise in one package's code (numpy_ref's: the table of the module docstring)."""

    modules: frozenset  # the module names of func-swap, call-drop and where-swap: np.max(...), torch.max(...)
    swaps: dict  # module functions (func-swap)
    method_swaps: dict  # methods of any other object (func-swap)
    unwrap: frozenset  # module functions f(x) -> x (call-drop)
    method_unwrap: frozenset  # methods x.f(...) -> x (call-drop)
    axis_keywords: frozenset
    orderless_axis_keywords: frozenset  # a reduction over (0, 1) is a reduction over (1, 0)
    axis_methods: frozenset  # methods whose integer arguments are axes
    perm_methods: frozenset  # methods whose integer arguments are a permutation (perm-swap)
    keepdims: str  # the keyword of keepdims


NUMPY_DIALECT = Dialect(
    modules=frozenset({"np", "numpy"}),
    swaps=NP_SWAPS,
    method_swaps=METHOD_SWAPS,
    unwrap=NP_UNWRAP,
    method_unwrap=METHOD_UNWRAP,
    axis_keywords=AXIS_KEYWORDS,
    orderless_axis_keywords=ORDERLESS_AXIS_KEYWORDS,
    axis_methods=AXIS_METHODS,
    perm_methods=PERM_METHODS,
    keepdims="keepdims",
)
TORCH_DIALECT = Dialect(
    modules=frozenset({"torch"}),
    swaps={**NP_SWAPS, "zeros_like": "ones_like", "ones_like": "zeros_like"},
    method_swaps={
        **METHOD_SWAPS,
        **{k: NP_SWAPS[k] for k in ("amax", "amin", "tril", "triu")},
        "tril_": "triu_",
        "triu_": "tril_",
    },
    unwrap=frozenset({"abs"}),
    method_unwrap=frozenset({"clone", "contiguous", "detach"}),
    axis_keywords=frozenset({"dim", "dims", "dim0", "dim1", "source", "destination"}),
    orderless_axis_keywords=frozenset({"dim"}),
    # torch's transpose swaps two axes (its arguments are axes, not a permutation)
    axis_methods=frozenset({"unsqueeze", "squeeze", "transpose", "swapaxes", "movedim", "flip"}),
    perm_methods=frozenset({"permute"}),
    keepdims="keepdim",
)
#: jax.numpy follows NumPy's names (axis=, keepdims=, transpose as a permutation); lax adds stop_gradient.
JAX_DIALECT = Dialect(
    modules=frozenset({"jnp", "jax.numpy", "lax", "jax.lax"}),
    swaps={**NP_SWAPS, "zeros_like": "ones_like", "ones_like": "zeros_like"},
    method_swaps=METHOD_SWAPS,
    unwrap=frozenset({"abs", "asarray", "array", "stop_gradient"}),
    method_unwrap=frozenset(),
    axis_keywords=AXIS_KEYWORDS,
    orderless_axis_keywords=ORDERLESS_AXIS_KEYWORDS,
    axis_methods=AXIS_METHODS,
    perm_methods=frozenset({"transpose"}),
    keepdims="keepdims",
)


@dataclass(frozen=True)
class KernelScope:
    """One kernel of a package in the campaign: the adapters its cells run through and the files only it runs."""

    name: str  # what --kernel takes: "torch:tiles"
    adapters: tuple  # load names (conformance.adapters.load_adapter) of the adapters that run it
    files: tuple = ()  # files (relative to the package) that only this kernel runs; the others are shared
    note: str = ""  # how the campaign runs it, where that differs from the adapter of the same name


@dataclass(frozen=True)
class Package:
    """One package the campaign mutates, and how its mutants run."""

    name: str
    kernels: tuple  # KernelScope, in report order
    excluded: tuple = ()  # out of scope, relative to the package
    included: Optional[tuple] = None  # fnmatch patterns relative to the package: only these files (None: all)
    dialect: Dialect = NUMPY_DIALECT
    #: before the file of each mutant id and unreached.json key: "" for numpy_ref (whose stored ids predate the
    #: other packages), "<package>/" for the others, so that an id names one place in the repository
    id_prefix: str = ""
    #: modules the parent imports before it forks (imports only: no operation runs in the parent, since a
    #: thread pool started there would not survive the fork); each child then skips their import
    preload: tuple = ()
    #: runs once in the parent after the preloads, before the first fork: the environment the children share, and
    #: a check that the preloads started nothing that a fork would break
    before_fork: Optional[Callable[[], None]] = None
    child_setup: Optional[Callable[[], None]] = None  # runs first in each child (thread counts)
    #: a mutant runs only the (case, adapter) cells whose unmutated run executed one of its lines (False: every
    #: cell of the package, as numpy_ref's campaign always did)
    cell_reach: bool = False
    subdir: str = ""  # its equivalent.json, unreached.json and reports: campaign_data/<subdir>
    timeout: float = DEFAULT_TIMEOUT  # seconds a mutant's child may run (--timeout overrides it)

    @property
    def adapters(self) -> tuple:
        return tuple(dict.fromkeys(a for k in self.kernels for a in k.adapters))

    @property
    def data_dir(self) -> pathlib.Path:
        return DATA_DIR / self.subdir if self.subdir else DATA_DIR

    def kernel(self, name: str) -> KernelScope:
        return next(k for k in self.kernels if k.name == name)


#: PyTorch's switch that runs eager FlexAttention's operator in Python instead of under Dynamo (_torch_child)
FLEX_EAGER_FLAG = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"


def _torch_child() -> None:
    """A child's PyTorch runs its operations on one thread: two children share the two cores, and no child
    inherits a thread pool from the parent (which never ran an operation).

    And FlexAttention (torch:flex) runs its operator in Python, not under ``torch.compile(backend="eager")``,
    which eager ``flex_attention`` otherwise wraps it in (PyTorch's ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``):
    the same operations on the same tensors (the forward; the CPU has no backward), but Python's line tracer
    sees the score_mod's lines run per cell, where Dynamo's compiled frames hide them (the unmutated run would
    record the scheme hooks as reached only by the cells that call them outside FlexAttention, and a mutant
    there would skip the cells that run it), and a cell takes a fifth of the time (4.1 s where 22.1 s for
    the float32 cells of shaw/* and alibi/*). The compiled path itself is certified by ``conformance run
    --adapter torch:flex``."""
    import torch
    import torch.nn.attention.flex_attention as flex

    torch.set_num_threads(1)
    if not hasattr(flex, FLEX_EAGER_FLAG):  # set anyway, it would change nothing: the reach would be wrong again
        raise RuntimeError(f"torch.nn.attention.flex_attention has no {FLEX_EAGER_FLAG} in PyTorch {torch.__version__}")
    setattr(flex, FLEX_EAGER_FLAG, True)


def _jax_before_fork() -> None:
    """The jax children share one XLA compilation cache (a fresh folder of this run, removed at its exit), so a
    program that a mutant leaves unchanged loads from it instead of compiling again; and JAX may be imported here
    but never initialised: its backends start XLA's thread pools (and JAX's at-fork warning), which a forked child
    would inherit without their threads."""
    from jax._src import xla_bridge

    from .adapters._jax import _compilation_cache

    if xla_bridge._backends:
        raise RuntimeError("the campaign's parent initialised a JAX backend before forking its children")
    _compilation_cache()  # sets ATTNSPEC_JAX_CACHE_DIR, which the children inherit


def _fast_xla_compiles() -> None:
    """A child's XLA compiles without its fusion emitters (the older ones: about a third less compile time, 0.16 s
    where 0.25 s for a case's program; the unmutated run passes every check so) and runs its programs on one
    thread (two children share the two cores). Its backend starts in the child, after these flags are read.
    (Its optimisation level stays: at 0, XLA's CPU programs give -inf and NaN gradients where a -inf bias meets
    a causal rule, failing the unmutated run.)"""
    from .adapters import _jax

    _jax.fast_cpu_compiles()
    flags = os.environ["XLA_FLAGS"]
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false"


#: The tiles kernel with tiles of a few rows (conformance.adapters.torch_impl_adapter.TorchSmallTilesAdapter).
SMALL_TILES_ADAPTER = "conformance.adapters.torch_impl_adapter:TorchSmallTilesAdapter"
#: jax_impl's tiles kernel cut into a few query tiles per call, its pallas kernel into a few blocks per call.
JAX_SMALL_TILES_ADAPTER = "conformance.adapters.jax_impl_adapter:JaxSmallTilesAdapter"
JAX_SMALL_BLOCKS_ADAPTER = "conformance.adapters.jax_impl_adapter:JaxSmallBlocksPallasAdapter"
PACKAGES: dict = {
    p.name: p
    for p in (
        Package(
            name=PACKAGE,
            kernels=(KernelScope("numpy", ("numpy", "numpy:blockwise")),),
            excluded=EXCLUDED,
        ),
        Package(
            name="torch_impl",
            kernels=(
                KernelScope("torch:eager", ("torch:eager",), ("kernels/eager.py",)),
                KernelScope(
                    "torch:tiles",
                    (SMALL_TILES_ADAPTER, "torch:tiles"),
                    ("kernels/tiles.py",),
                    note="through torch:tiles-small (TorchSmallTilesAdapter), the tiles kernel with its knobs sized "
                    "to cut each call into a few query tiles and (batch, head) groups, so that every case crosses "
                    "tile boundaries and causal tiles skip keys, and through torch:tiles, its default knobs, which "
                    "put a catalog case in one tile",
                ),
                KernelScope("torch:sdpa", ("torch:sdpa",), ("kernels/sdpa.py",)),
                KernelScope(
                    "torch:flex",
                    ("torch:flex",),
                    ("kernels/flex.py",),
                    note="FlexAttention called eagerly (Flex(compiled=False), what torch:flex runs on a CPU) and "
                    "in Python, outside Dynamo (as its debug flag asks): the same score_mod and log-sum-exp as "
                    "the compiled kernel, forward cells only (PyTorch has no FlexAttention backward on a CPU)",
                ),
            ),
            # the kernels the four adapters run and what they share; not the triton kernel (its programs run
            # through Triton's interpreter: tests/test_torch_triton.py and .ci/run's torch:triton line), the
            # ring, the nn.Module and interop, whose adapters and tests are elsewhere
            included=(
                "_checks.py",
                "_core.py",
                "_workspace.py",
                "functional.py",
                "kernels/__init__.py",
                "kernels/_base.py",
                "kernels/eager.py",
                "kernels/flex.py",
                "kernels/sdpa.py",
                "kernels/tiles.py",
                "schemes/*.py",
            ),
            dialect=TORCH_DIALECT,
            id_prefix="torch_impl/",
            # torch_impl.ring imports torch.distributed; the first backward imports symbolic_shapes (and sympy):
            # 0.4 s that each child would pay again; FlexAttention's module, whose debug flag the child sets
            preload=(
                "torch",
                "torch.distributed",
                "torch.fx.experimental.symbolic_shapes",
                "torch.nn.attention.flex_attention",
            ),
            child_setup=_torch_child,
            cell_reach=True,
            subdir="torch_impl",
        ),
        Package(
            name="jax_impl",
            kernels=(
                # kernels/xla.py is shared: its attend and block_logits are the body of every query tile
                KernelScope("jax:xla", ("jax:xla",)),
                KernelScope(
                    "jax:tiles",
                    (JAX_SMALL_TILES_ADAPTER,),
                    ("kernels/tiles.py",),
                    note="through jax:tiles-small (JaxSmallTilesAdapter), the tiles kernel with query_rows sized to "
                    "cut each plain causal call of four queries or more into a few query tiles (its one-tile path "
                    "is every other call's, so the default knob, which cuts only the long cases, adds no path)",
                ),
                KernelScope(
                    "jax:pallas",
                    (JAX_SMALL_BLOCKS_ADAPTER, "jax:pallas"),
                    ("kernels/pallas.py",),
                    note="in interpret mode through jax:pallas-small (JaxSmallBlocksPallasAdapter), the pallas kernel "
                    "with blocks sized to cut each call into a few blocks of queries and of keys, and through "
                    "jax:pallas, its default blocks of 16",
                ),
            ),
            # the kernels the three adapters run and what they share; not the Flax NNX module and interop (the
            # module only round-trips its parameters in the conformance cells; tests/test_jax_impl.py and the
            # flax adapters check both) nor the ring (its adapter jax:ring shards over host devices)
            included=(
                "_checks.py",
                "functional.py",
                "heads.py",
                "masking.py",
                "kernels/*.py",
                "schemes/*.py",
            ),
            dialect=JAX_DIALECT,
            id_prefix="jax_impl/",
            # imported, never initialised (_jax_before_fork checks): 3 s of imports that each child would pay again
            preload=("jax", "jax.numpy", "jax.experimental.pallas", "flax.nnx"),
            before_fork=_jax_before_fork,
            child_setup=_fast_xla_compiles,
            cell_reach=True,
            subdir="jax_impl",
            # a mutant that survives runs every cell that evaluated it, each tracing and compiling its programs
            # again (0.2 to 1 s; a class default of a kernel knob: every cell)
            timeout=900.0,
        ),
    )
}
#: --kernel NAME -> its package
KERNELS: dict = {k.name: p.name for p in PACKAGES.values() for k in p.kernels}


def _package(package) -> Package:
    return package if isinstance(package, Package) else PACKAGES[package]


def module_name(rel: str, package: str = PACKAGE) -> str:
    parts = [package] + rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_dir(package: str = PACKAGE) -> pathlib.Path:
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        return pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()
    return HERE.parent / package


def scope_files(root: Optional[pathlib.Path] = None, package: str = PACKAGE) -> list[str]:
    """The files the campaign mutates, relative to the package's folder, sorted."""
    p = _package(package)
    root = root or package_dir(p.name)
    files = sorted(x.relative_to(root).as_posix() for x in root.rglob("*.py") if "__pycache__" not in x.parts)
    if p.included is not None:
        files = [f for f in files if any(fnmatch.fnmatchcase(f, pattern) for pattern in p.included)]
    return [f for f in files if f not in p.excluded]


def kernel_files(files: list[str], package: str = PACKAGE, kernels: Optional[list] = None) -> list[str]:
    """The files of ``files`` that the kernels named run: their own and the shared ones (all: every file)."""
    p = _package(package)
    if not kernels:
        return list(files)
    others = {f for k in p.kernels if k.name not in kernels for f in k.files}
    return [f for f in files if f not in others]


def select_targets(targets: Optional[list], files: list[str], package: str = PACKAGE) -> list[str]:
    """The files ``--target`` names (a path relative to the package or the repository, or an fnmatch pattern)."""
    p = _package(package)
    if not targets:
        return list(files)
    chosen = set()
    for t in targets:
        pattern = t[len(p.name) + 1 :] if t.startswith(p.name + "/") else t
        hits = [f for f in files if fnmatch.fnmatchcase(f, pattern)]
        if not hits:
            out = f"{' and '.join(p.excluded)} are out of scope" if p.excluded else "its other files are out of scope"
            raise _bad(
                "--target",
                f"a file of {p.name}/ in the campaign's scope or a pattern matching one ({', '.join(files)}; {out})",
                repr(t),
            )
        chosen.update(hits)
    return [f for f in files if f in chosen]


def _is_int(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _literal_number(node, kind) -> Optional[object]:
    """The value of a number literal (``3``, ``-3``, ``0.5``, ``-0.5``) of type ``kind``, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is kind:
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) is kind
    ):
        return -node.operand.value
    return None


def _number(value) -> ast.expr:
    """A number literal as the parser writes it: a negative one is ``-`` applied to a positive constant."""
    return ast.UnaryOp(ast.USub(), ast.Constant(-value)) if value < 0 else ast.Constant(value)


def _dotted(node) -> Optional[str]:
    """``np`` for a name, ``jax.numpy`` for an attribute of names; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _is_np(func, names, modules=NUMPY_DIALECT.modules) -> bool:
    """``func`` is ``np.<name>`` (or ``torch.<name>``, ``jax.numpy.<name>``: ``modules`` naming the module, dotted
    or not) for a name of ``names``."""
    return isinstance(func, ast.Attribute) and func.attr in names and _dotted(func.value) in modules


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _target_names(target) -> Iterator[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _target_names(t)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)
    else:
        yield target


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _bindings(scope) -> dict:
    """name -> first line bound in ``scope`` (a module or function), not looking into nested scopes."""
    first: dict = {}

    def bind(name, line):
        first[name] = min(first.get(name, line), line)

    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = scope.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
            bind(arg.arg, 0)
    body = scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) else []

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(node.name, node.lineno)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bind(node.id, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bind((alias.asname or alias.name).split(".")[0], node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in body:
        visit(stmt)
    return first


def _docstring_rules(node) -> tuple:
    """The rule ids of the spec that a module's, class's or function's docstring names, in order."""
    from spec import rule_ids

    known = set(rule_ids())
    found = RULE_MENTION.findall(ast.get_docstring(node) or "")
    return tuple(dict.fromkeys(r for r in found if r in known))


class _Generator:
    """Walks one module in a fixed order and lists every mutant of it."""

    def __init__(self, source: str, rel: str, package: str = PACKAGE):
        self.source, self.rel, self.package = source, rel, _package(package)
        self.dialect = self.package.dialect
        self.tree = ast.parse(source)
        self.found: list = []  # (line, col, order, variant, qualname, operator, node, replacement, path, reach)
        self.order = 0
        self.scope_bindings: dict = {}
        self.rules = {"<module>": _docstring_rules(self.tree)}  # qualname -> the rules its code implements

    # ---------------------------------------------------------------- walk
    def run(self) -> list[Mutant]:
        self.walk(self.tree, (), [], "<module>", self.tree, None)
        self.found.sort(key=lambda m: (m[0], m[1], m[2], m[3]))
        counters: dict = {}
        seen = set()
        out = []
        for line, col, _, _, qualname, operator, node, replacement, path, reach in self.found:
            mutated = "pass" if replacement is None else ast.unparse(replacement)
            if (path, mutated) in seen:
                continue
            seen.add((path, mutated))
            key = (qualname, operator)
            k = counters.get(key, 0)
            counters[key] = k + 1
            out.append(
                Mutant(
                    id=f"{self.package.id_prefix}{self.rel}:{qualname}:{operator}:{k}",
                    file=self.rel,
                    function=qualname,
                    operator=operator,
                    line=line,
                    col=col,
                    end_line=getattr(node, "end_lineno", None) or line,
                    original=ast.unparse(node),
                    mutated=mutated,
                    path=path,
                    replacement=replacement,
                    reach=reach or (line, getattr(node, "end_lineno", None) or line),
                    rules=self.rules[qualname],
                    package=self.package.name,
                    end_col=getattr(node, "end_col_offset", None) or -1,
                )
            )
        return out

    def walk(self, node, path, parents, qualname, scope, reach):
        self.order += 1
        self.reach = reach
        self.mutate(node, path, parents, qualname, scope)
        body_reach = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            prefix = "" if qualname == "<module>" else qualname + "."
            if parents and isinstance(self._scope_of(parents), (ast.FunctionDef, ast.AsyncFunctionDef)):
                prefix = qualname + ".<locals>."
            self.rules[prefix + node.name] = _docstring_rules(node) or self.rules[qualname]
            qualname = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                scope = node
                # a default value matters only when the function runs: reached when its first statement is
                first = next((s for i, s in enumerate(node.body) if not self.skip_child(node, "body", i, s)), None)
                body_reach = None if first is None else (first.lineno, first.lineno)
        parents = parents + [node]
        for name, value in ast.iter_fields(node):
            if self.skip_field(node, name):
                continue
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST) and not self.skip_child(node, name, i, child):
                        self.walk(child, path + ((name, i),), parents, qualname, scope, reach)
            elif isinstance(value, ast.AST) and not self.skip_child(node, name, None, value):
                self.walk(value, path + ((name, None),), parents, qualname, scope, body_reach or reach)

    @staticmethod
    def _scope_of(parents):
        for p in reversed(parents):
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                return p
        return None

    @staticmethod
    def skip_field(node, name) -> bool:
        if name in ("annotation", "returns", "decorator_list", "type_comment"):
            return True
        if isinstance(node, ast.Raise) and name in ("exc", "cause"):
            return True  # the exception and its message; the raise itself can still be dropped
        if isinstance(node, ast.Assert) and name == "msg":
            return True
        return isinstance(node, ast.JoinedStr)

    @staticmethod
    def skip_child(node, name, i, child) -> bool:
        if isinstance(child, ast.JoinedStr):
            return True
        docstring_holder = isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        return (
            docstring_holder
            and name == "body"
            and i == 0
            and isinstance(child, ast.Expr)
            and isinstance(child.value, ast.Constant)
            and isinstance(child.value.value, str)
        )

    def add(self, node, path, qualname, operator, replacement, variant=0):
        if replacement is not None:
            replacement = ast.fix_missing_locations(ast.copy_location(replacement, node))
            if ast.dump(replacement) == ast.dump(node):
                return
        line, col = node.lineno, node.col_offset
        self.found.append((line, col, self.order, variant, qualname, operator, node, replacement, path, self.reach))

    # ------------------------------------------------------------ operators
    def mutate(self, node, path, parents, qualname, scope):
        parent = parents[-1] if parents else None
        if isinstance(node, ast.BinOp):
            self.binop(node, path, qualname)
        elif isinstance(node, ast.AugAssign):
            table = ARITH if type(node.op) in ARITH else BITWISE if type(node.op) in BITWISE else None
            if table:
                new = copy.deepcopy(node)
                new.op = table[type(node.op)]()
                self.add(node, path, qualname, "arith" if table is ARITH else "bitwise", new)
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in COMPARE:
                    new = copy.deepcopy(node)
                    new.ops[i] = COMPARE[type(op)]()
                    self.add(node, path, qualname, "compare", new, variant=i)
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self.add(node, path, qualname, "boolop", new)
        elif isinstance(node, ast.UnaryOp):
            self.unary(node, path, parent, qualname)
        elif isinstance(node, ast.Constant) and not (
            isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
        ):
            self.number(node, path, parents, qualname)
        elif isinstance(node, ast.Call):
            self.call(node, path, qualname)
        elif isinstance(node, (ast.Tuple, ast.List)):
            self.permutation(node, path, parent, qualname)
        elif isinstance(node, ast.Slice):
            self.slice(node, path, qualname)
        elif isinstance(node, ast.Subscript):
            self.none_move(node, path, qualname)
        elif isinstance(node, ast.keyword):
            keepdims = self.dialect.keepdims
            if node.arg == keepdims and isinstance(node.value, ast.Constant) and node.value.value is True:
                self.add(node, path, qualname, "keepdims", ast.keyword(arg=keepdims, value=ast.Constant(False)))
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            self.negate(node.test, path + (("test", None),), qualname)
        elif isinstance(node, ast.comprehension):
            for i, test in enumerate(node.ifs):
                self.negate(test, path + (("ifs", i),), qualname)
        if isinstance(node, ast.stmt):
            self.statement(node, path, parents, qualname, scope)

    def binop(self, node, path, qualname):
        if any(isinstance(x, ast.Constant) and isinstance(x.value, (str, bytes)) for x in (node.left, node.right)):
            return
        op = type(node.op)
        for table, name in ((ARITH, "arith"), (BITWISE, "bitwise")):
            if op in table:
                new = copy.deepcopy(node)
                new.op = table[op]()
                self.add(node, path, qualname, name, new)
        if op in SWAP_OPERANDS:
            new = copy.deepcopy(node)
            new.left, new.right = new.right, new.left
            self.add(node, path, qualname, "operand-swap", new)
        if op in DROP_OPERANDS:
            self.add(node, path, qualname, "operand-drop", copy.deepcopy(node.left), variant=0)
            self.add(node, path, qualname, "operand-drop", copy.deepcopy(node.right), variant=1)

    def unary(self, node, path, parent, qualname):
        if isinstance(node.op, ast.Not):
            self.add(node, path, qualname, "not-removal", copy.deepcopy(node.operand))
        elif isinstance(node.op, ast.Invert):
            self.add(node, path, qualname, "invert-removal", copy.deepcopy(node.operand))
        elif isinstance(node.op, ast.USub):
            if isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
                self.number(node, path, None, qualname, parent=parent)
            else:
                self.add(node, path, qualname, "neg-removal", copy.deepcopy(node.operand))

    def number(self, node, path, parents, qualname, parent=None):
        """int-const, float-const, axis and index (a slice bound is mutated by ``slice``)."""
        if parents is not None:
            parent = parents[-1] if parents else None
        value = _literal_number(node, int)
        if value is not None:
            operator = self.int_context(node, path, parent)
            if operator is None:
                return
            for v, new in enumerate((value + 1, value - 1)):
                self.add(node, path, qualname, operator, _number(new), variant=v)
            return
        value = _literal_number(node, float)
        if value is not None:
            variants = (1.0,) if value == 0.0 else (-value, 2.0 * value)
            for v, new in enumerate(variants):
                self.add(node, path, qualname, "float-const", _number(new), variant=v)

    def int_context(self, node, path, parent) -> Optional[str]:
        d = self.dialect
        grand = self._parent_of_path(path, 2)
        field_name = path[-1][0] if path else None
        if isinstance(parent, ast.Slice):
            return None
        if isinstance(parent, ast.keyword) and parent.arg in d.axis_keywords:
            return "axis"
        in_keyword = isinstance(grand, ast.keyword) and grand.arg in d.axis_keywords
        if isinstance(parent, (ast.Tuple, ast.List)) and in_keyword:
            return "axis"
        if isinstance(parent, ast.Call) and field_name == "args":
            name = _call_name(parent)
            if name in d.perm_methods:
                return None
            if name in d.axis_methods:
                return "axis"
        if (
            isinstance(parent, (ast.Tuple, ast.List))
            and isinstance(grand, ast.Call)
            and _call_name(grand) in d.perm_methods
        ):
            return None
        if isinstance(parent, ast.Subscript) and field_name == "slice":
            return "index"
        if isinstance(parent, ast.Tuple) and isinstance(grand, ast.Subscript) and self._path_field(path, 1) == "slice":
            return "index"
        return "int-const"

    def _parent_of_path(self, path, up):
        if len(path) < up:
            return None
        node = self.tree
        for name, i in path[:-up]:
            node = getattr(node, name) if i is None else getattr(node, name)[i]
        return node

    @staticmethod
    def _path_field(path, up):
        return path[-1 - up][0] if len(path) > up else None

    def call(self, node, path, qualname):
        d = self.dialect
        f = node.func
        name = _call_name(node)
        if _is_np(f, d.swaps, d.modules):
            new = copy.deepcopy(node)
            new.func.attr = d.swaps[f.attr]
            self.add(node, path, qualname, "func-swap", new)
        elif isinstance(f, ast.Attribute) and f.attr in d.method_swaps and not _is_np(f, {f.attr}, d.modules):
            new = copy.deepcopy(node)
            new.func.attr = d.method_swaps[f.attr]
            self.add(node, path, qualname, "func-swap", new)
        elif isinstance(f, ast.Name) and f.id in BUILTIN_SWAPS:
            new = copy.deepcopy(node)
            new.func.id = BUILTIN_SWAPS[f.id]
            self.add(node, path, qualname, "func-swap", new)
        single = len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred)
        if single and (_is_np(f, d.unwrap, d.modules) or (isinstance(f, ast.Name) and f.id in BUILTIN_UNWRAP)):
            self.add(node, path, qualname, "call-drop", copy.deepcopy(node.args[0]))
        elif isinstance(f, ast.Attribute) and f.attr in d.method_unwrap and not _is_np(f, {f.attr}, d.modules):
            self.add(node, path, qualname, "call-drop", copy.deepcopy(f.value))
        if _is_np(f, {"where"}, d.modules) and len(node.args) == 3 and not node.keywords:
            new = copy.deepcopy(node)
            new.args[1], new.args[2] = new.args[2], new.args[1]
            self.add(node, path, qualname, "where-swap", new)
        literal = all(_literal_number(a, int) is not None for a in node.args)
        if name in d.perm_methods and len(node.args) >= 2 and literal:
            self._swaps(node, path, qualname, "args")

    def permutation(self, node, path, parent, qualname):
        values = [_literal_number(e, int) for e in node.elts]
        if len(values) < 2 or None in values or len(set(values)) < len(values):
            return
        if isinstance(parent, ast.keyword) and parent.arg in self.dialect.orderless_axis_keywords:
            return
        if isinstance(parent, ast.Subscript):
            return
        self._swaps(node, path, qualname, "elts")

    def _swaps(self, node, path, qualname, field_name):
        items = getattr(node, field_name)
        variant = 0
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                new = copy.deepcopy(node)
                seq = getattr(new, field_name)
                seq[i], seq[j] = seq[j], seq[i]
                self.add(node, path, qualname, "perm-swap", new, variant=variant)
                variant += 1

    def slice(self, node, path, qualname):
        for f_index, name in enumerate(("lower", "upper", "step")):
            bound = getattr(node, name)
            if bound is None:
                continue
            value = _literal_number(bound, int)
            if value is not None:
                variants = [_number(value + 1), _number(value - 1)]
            elif (
                isinstance(bound, ast.BinOp)
                and isinstance(bound.op, (ast.Add, ast.Sub))
                and _literal_number(bound.right, int) is not None
            ):
                continue  # int-const moves the literal by one
            else:
                variants = [
                    ast.BinOp(copy.deepcopy(bound), ast.Add(), ast.Constant(1)),
                    ast.BinOp(copy.deepcopy(bound), ast.Sub(), ast.Constant(1)),
                ]
            for v, new_bound in enumerate(variants):
                new = copy.deepcopy(node)
                setattr(new, name, new_bound)
                self.add(node, path, qualname, "slice", new, variant=2 * f_index + v)

    def none_move(self, node, path, qualname):
        if not isinstance(node.slice, ast.Tuple):
            return
        elts = node.slice.elts
        variant = 0
        for i, e in enumerate(elts):
            if not (isinstance(e, ast.Constant) and e.value is None):
                continue
            for j in (i - 1, i + 1):
                if 0 <= j < len(elts) and not (isinstance(elts[j], ast.Constant) and elts[j].value is None):
                    new = copy.deepcopy(node)
                    seq = new.slice.elts
                    seq[i], seq[j] = seq[j], seq[i]
                    self.add(node, path, qualname, "none-move", new, variant=variant)
                    variant += 1

    def negate(self, test, path, qualname):
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], NEGATION_COVERED):
            return
        self.add(test, path, qualname, "cond-negate", ast.UnaryOp(ast.Not(), copy.deepcopy(test)))

    def statement(self, node, path, parents, qualname, scope):
        if isinstance(node, (ast.AugAssign, ast.Raise)):
            droppable = True
        elif isinstance(node, ast.Expr):
            droppable = isinstance(node.value, ast.Call)
        elif isinstance(node, ast.Assign):
            droppable = all(self._rebinds(t, node.lineno, scope) for t in node.targets)
        else:
            droppable = False
        if droppable:
            self.add(node, path, qualname, "stmt-drop", None)

    def _rebinds(self, target, line, scope) -> bool:
        if scope not in self.scope_bindings:
            self.scope_bindings[scope] = _bindings(scope)
        bound = self.scope_bindings[scope]
        for t in _target_names(target):
            if isinstance(t, ast.Name) and not bound.get(t.id, line) < line:
                return False
        return True


def generate(source: str, rel: str, package: str = PACKAGE) -> list[Mutant]:
    """Every mutant of one module's source, in source order; ``rel`` is the path relative to the package."""
    return _Generator(source, rel, package).run()


def generate_files(files: list[str], root: Optional[pathlib.Path] = None, package: str = PACKAGE) -> list[Mutant]:
    root = root or package_dir(package)
    out = []
    for rel in files:
        out.extend(generate((root / rel).read_text(encoding="utf-8"), rel, package))
    return out


def mutated_tree(source: str, mutant: Mutant) -> ast.Module:
    """The module's AST with the mutant applied."""
    tree = ast.parse(source)
    holder, (name, i) = tree, mutant.path[-1]
    for step_name, step_i in mutant.path[:-1]:
        holder = getattr(holder, step_name) if step_i is None else getattr(holder, step_name)[step_i]
    old = getattr(holder, name) if i is None else getattr(holder, name)[i]
    new = ast.copy_location(ast.Pass(), old) if mutant.replacement is None else copy.deepcopy(mutant.replacement)
    if i is None:
        setattr(holder, name, new)
    else:
        getattr(holder, name)[i] = new
    return ast.fix_missing_locations(tree)


def mutated_source(source: str, mutant: Mutant) -> str:
    """The source text with only the mutated node rewritten (for reading; the campaign runs the AST)."""
    tree = ast.parse(source)
    node = tree
    for step_name, step_i in mutant.path:
        node = getattr(node, step_name) if step_i is None else getattr(node, step_name)[step_i]
    lines = source.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: node.lineno - 1]) + _byte_to_char(lines[node.lineno - 1], node.col_offset)
    end = sum(len(x) for x in lines[: node.end_lineno - 1]) + _byte_to_char(
        lines[node.end_lineno - 1], node.end_col_offset
    )
    want = ast.dump(mutated_tree(source, mutant))
    for text in (mutant.mutated, f"({mutant.mutated})"):
        candidate = source[:start] + text + source[end:]
        try:
            if ast.dump(ast.parse(candidate)) == want:
                return candidate
        except SyntaxError:
            continue
    return ast.unparse(mutated_tree(source, mutant)) + "\n"


def _byte_to_char(line: str, offset: int) -> int:
    return len(line.encode("utf-8")[:offset].decode("utf-8", errors="replace"))


def diff(mutant: Mutant, root: Optional[pathlib.Path] = None) -> str:
    root = root or package_dir(mutant.package)
    source = (root / mutant.file).read_text(encoding="utf-8")
    name = f"{mutant.package}/{mutant.file}"
    return "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True),
            mutated_source(source, mutant).splitlines(keepends=True),
            name,
            f"{name} ({mutant.id})",
        )
    )


# ============================================================ child process
class _FirstFailure(BaseException):
    """Raised by the first failing check of a case (a BaseException: the checks' own handlers let it pass)."""

    def __init__(self, result: CheckResult):
        self.result = result


class _StoppingCaseRun(CaseRun):
    """Stops at the first failing check that claims one of ``stop_rules`` (any failing check when empty)."""

    stop_rules: frozenset = frozenset()

    def add(self, check, status, rules, **kw):
        super().add(check, status, rules, **kw)
        if status == "fail" and (not self.stop_rules or self.stop_rules & set(rules)):
            raise _FirstFailure(self.results[-1])


class _MutantLoader(importlib.abc.Loader):
    def __init__(self, code):
        self.code = code

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(self.code, module.__dict__)


class _MutantFinder(importlib.abc.MetaPathFinder):
    """Serves modules of the package from compiled code instead of their files: the one mutated module, and
    (``_CodeFinder``) the others from the parent's compilation, so that no child compiles them again."""

    def __init__(self, name: str, filename: str, code):
        self.codes = {name: (filename, code)}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.codes:
            return None
        filename, code = self.codes[fullname]
        package = os.path.basename(filename) == "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname,
            filename,
            loader=_MutantLoader(code),
            submodule_search_locations=[os.path.dirname(filename)] if package else None,
        )


class _CodeFinder(_MutantFinder):
    def __init__(self, codes: dict):
        self.codes = codes  # module name -> (filename, code)


def _compile_package(package: str) -> dict:
    """module name -> (filename, code) of every module of the package, unmutated."""
    root = package_dir(package)
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        filename = str(path)
        name = module_name(path.relative_to(root).as_posix(), package)
        out[name] = (filename, compile(path.read_text(encoding="utf-8"), filename, "exec", dont_inherit=True))
    return out


def _holds_reference(module, package: str = PACKAGE) -> bool:
    for value in list(vars(module).values()):
        name = getattr(value, "__name__", None) if isinstance(value, type(sys)) else getattr(value, "__module__", None)
        if isinstance(name, str) and (name == package or name.startswith(package + ".")):
            return True
    return False


def _purge(package: str = PACKAGE) -> None:
    """Forget the package, its submodules and the conformance modules that hold references to it."""
    for name in list(sys.modules):
        module = sys.modules[name]
        if name == package or name.startswith(package + "."):
            del sys.modules[name]
        elif name.startswith("conformance.") and name != __name__ and module is not None:
            try:
                holds = _holds_reference(module, package)
            except TypeError:  # not a module object
                holds = False
            if holds:
                del sys.modules[name]


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + CHILD_EXTRA_MEMORY
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, ImportError):
        pass


def _describe_exception(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return _short(f"{type(e).__name__}: {e}{where}")


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


class _Tracer:
    """Lines of the files in scope that run (``sys.settrace``; other files are not traced), per cell.

    ``cell`` is the (case, adapter) cell running now, or None while the package imports (its module-level code,
    which every cell then depends on). With ``opcodes`` it also records each bytecode instruction that runs (the
    code object and its offset), whose source span tells which expressions of a line ran.
    """

    def __init__(self, files: dict, opcodes: bool = False):
        self.files, self.opcodes = files, opcodes
        self.cache: dict = {}
        self.cells: dict = {None: set()}  # cell -> {(rel, line)}
        self.ops: dict = {None: set()}  # cell -> {(code, offset)}
        self.hits, self.ran = self.cells[None], self.ops[None]

    @property
    def lines(self) -> set:
        return set().union(*self.cells.values())

    def enter(self, cell) -> None:
        self.hits = self.cells.setdefault(cell, set())
        self.ran = self.ops.setdefault(cell, set())

    def rel(self, filename):
        if filename not in self.cache:
            self.cache[filename] = self.files.get(os.path.realpath(filename))
        return self.cache[filename]

    def function(self):
        """The global trace function: ``self``, with the test for a file out of scope inlined (it runs at every call
        of every frame, JAX's tracing of a program included)."""
        get, unseen, traced = self.cache.get, object(), self.__call__

        def global_trace(frame, event, arg):
            if get(frame.f_code.co_filename, unseen) is None:
                return None
            return traced(frame, event, arg)

        return global_trace

    def __call__(self, frame, event, arg):
        rel = self.rel(frame.f_code.co_filename)
        if rel is None:
            return None
        tracer = self
        tracer.hits.add((rel, frame.f_lineno))
        if self.opcodes:
            frame.f_trace_opcodes = True

        def local(frame, event, arg):
            if event == "opcode":
                tracer.ran.add((frame.f_code, frame.f_lasti))
            elif event == "line":
                tracer.hits.add((rel, frame.f_lineno))
            return local

        return local

    def spans(self, number) -> dict:
        """(rel, line, col, end_line, end_col) of every instruction that ran -> the numbers of the cells it ran in
        (``number(cell)``), from the code objects' source positions."""
        positions: dict = {}
        out: dict = {}
        for cell, ran in self.ops.items():
            n = number(cell)
            for code, offset in ran:
                if code not in positions:
                    positions[code] = list(code.co_positions())
                line, end_line, col, end_col = positions[code][offset // 2]
                if None in (line, end_line, col, end_col):
                    continue
                out.setdefault((self.rel(code.co_filename), line, col, end_line, end_col), set()).add(n)
        return out


class _Child:
    """What one forked child does: import the (mutated) package, build its adapters and run cells."""

    def __init__(self, state: "_State", write):
        self.state, self.write = state, write

    def run(self, module: Optional[tuple], cells: list, stop_early: bool, trace: bool, rules=()) -> dict:
        """Run the (case index, adapter index) ``cells`` in order; with ``stop_early``, until a check claiming
        one of ``rules`` fails.

        The cells of cases naming one of ``rules`` run first. A failure of a check that claims none of them is
        kept (``killed`` with ``by_rule`` False) while the search for a claiming one goes on through every cell.
        """
        state = self.state
        package = PACKAGES[state.package]
        if package.child_setup is not None:
            package.child_setup()
        _purge(package.name)
        sys.meta_path.insert(0, _CodeFinder(state.compiled))
        if module is not None:
            name, filename, code = module
            sys.meta_path.insert(0, _MutantFinder(name, filename, code))
        tracer = None
        if trace:
            tracer = _Tracer(state.trace_files, opcodes=package.cell_reach)
            sys.settrace(tracer.function())
        try:
            importlib.import_module(package.name)
            from conformance.adapters import load_adapter

            importlib.import_module(f"{__package__}.runner")  # an import error here kills the mutant ("import")
            adapters = [load_adapter(name) for name in state.adapters]
        except Exception as e:
            sys.settrace(None)
            killed = {"kind": "import", "case": None, "check": None, "message": _describe_exception(e)}
            return {"killed": dict(killed, by_rule=True)}  # no implementation of the spec imports: every rule fails
        self.rules = frozenset(rules)
        if self.rules:
            cells = sorted(cells, key=lambda cell: not self.rules & set(state.cases[cell[0]].all_rules))
        if module is not None and state.max_cells:
            cells = cells[: state.max_cells]
        failures, checks, first, current = [], 0, None, None
        for ran, (index, a) in enumerate(cells, 1):
            case = state.cases[index]
            if index != current:
                self.write({"case": index})
                current = index
            if tracer is not None:
                tracer.enter((index, a))
            killed = self.run_case(adapters[a], index, case, stop_early, failures)
            checks += self.checks
            if killed is not None and (killed["by_rule"] or not self.rules):
                return {"killed": killed, "ran": ran}
            first = first or killed
        sys.settrace(None)
        if first is not None:
            return {"killed": first, "ran": len(cells)}
        out: dict = {"killed": None, "checks": checks, "failures": failures, "ran": len(cells)}
        if tracer is not None:
            out["lines"] = sorted(tracer.lines)
            if package.cell_reach:  # line or instruction -> the cells that ran it; -1: the import, which all need
                n = len(adapters)

                def number(cell):
                    return -1 if cell is None else cell[0] * n + cell[1]

                reach: dict = {}
                for cell, hits in tracer.cells.items():
                    for hit in hits:
                        reach.setdefault(hit, []).append(number(cell))
                out["reach"] = [[rel, line, sorted(numbers)] for (rel, line), numbers in sorted(reach.items())]
                out["spans"] = [[*span, sorted(numbers)] for span, numbers in sorted(tracer.spans(number).items())]
        return out

    def run_case(self, adapter, index: int, case, stop_early: bool, failures: list) -> Optional[dict]:
        """One case through one adapter: with ``stop_early``, the failure that killed the mutant (a check
        claiming one of ``self.rules`` if one fails, else the first failing check) or None; without it None,
        the failures appended. ``self.checks`` is the number of checks it ran."""
        from .runner import Plan, apply_deviations, matrix

        state = self.state
        self.checks = 0
        self.adapter = adapter.name
        cells = list(matrix(Plan([adapter], [case], [cell_dtype(case)], [DEVICE])))
        if not cells or cells[0][5]:
            return None
        _, caps, device, dtype, _, _ = cells[0]
        deviations = [d for d in state.deviations if d.adapter == adapter.name]
        stopping = stop_early and not deviations
        case_run = (_StoppingCaseRun if stopping else CaseRun)(
            case, state.entries[index], state.tensors[index], adapter, caps, dtype, device
        )
        case_run.stop_rules = self.rules
        try:
            results = case_run.run()
        except _FirstFailure as first:
            failure = first.result
            self.checks = len(case_run.results)
            return self._killed("check", case.id, failure.check, failure.message, failure.rules)
        except Exception as e:
            killed = self._killed("exception", case.id, None, _describe_exception(e), case.all_rules)
            if stop_early:
                return killed
            failures.append(killed)
            return None
        finally:
            adapter.release()
        apply_deviations(results, deviations)
        self.checks = len(results)
        fails = [r for r in results if r.failed]
        fails.sort(key=lambda r: not self.rules & set(r.rules))  # a claiming failure first
        for r in fails:
            killed = self._killed("check", case.id, r.check, r.message, r.rules)
            if stop_early:
                return killed
            failures.append(killed)
        return None

    def _killed(self, kind, case, check, message, claimed) -> dict:
        # a call of the spec that raises breaks every rule the call is under, the mutant's among them
        raised = kind == "exception" or check in RAISING_CHECKS
        by_rule = raised or not self.rules or bool(self.rules & set(claimed))
        return {
            "kind": kind,
            "case": case,
            "check": check,
            "message": _short(message),
            "by_rule": by_rule,
            "adapter": self.adapter,
        }


def _child_entry(state, module, cells, stop_early, trace, rules, fd) -> None:
    """The body of a forked child: never returns."""
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        warnings.simplefilter("ignore")
        _limit_memory()

        def write(message):
            os.write(fd, (json.dumps(message) + "\n").encode())

        result = _Child(state, write).run(module, cells, stop_early, trace, rules)
        write({"result": result})
    except BaseException as e:
        code = 3
        try:
            os.write(fd, (json.dumps({"error": _describe_exception(e)}) + "\n").encode())
        except BaseException:
            pass
    finally:
        os._exit(code)


# ================================================================ scheduler
@dataclass
class _State:
    """What every child inherits: the package, its adapters' load names, the cases, their manifest entries and
    stored tensors."""

    cases: list
    entries: list
    tensors: list
    deviations: list
    trace_files: dict
    package: str = PACKAGE
    adapters: tuple = PACKAGES[PACKAGE].adapters
    compiled: dict = field(default_factory=dict)  # module name -> (filename, code): the unmutated package
    max_cells: Optional[int] = None  # a mutant runs at most this many of its cells, in its order (None: all)


@dataclass
class _Job:
    index: int
    pid: int
    fd: int
    started: float
    buffer: bytes = b""
    case: Optional[int] = None
    result: Optional[dict] = None
    error: Optional[str] = None


class _Pool:
    def __init__(self, state: _State, jobs: int, timeout: float):
        self.state, self.jobs, self.timeout = state, jobs, timeout
        self.selector = selectors.DefaultSelector()
        self.running: dict = {}  # fd -> _Job
        self.seconds: dict = {}  # index -> the wall time of its child
        self.cpu: dict = {}  # index -> the CPU time of its child (user and system)

    def start(self, index, module, cells, stop_early=True, trace=False, rules=()) -> None:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child_entry(self.state, module, cells, stop_early, trace, rules, write)
        os.close(write)
        job = _Job(index, pid, read, time.monotonic())
        self.running[read] = job
        self.selector.register(read, selectors.EVENT_READ)

    def finished(self) -> Iterator[tuple]:
        """Wait a little; yield (index, outcome) for every job that ended meanwhile."""
        if not self.running:
            return
        now = time.monotonic()
        deadline = min(j.started for j in self.running.values()) + self.timeout
        for key, _ in self.selector.select(timeout=max(0.0, min(1.0, deadline - now))):
            job = self.running[key.fd]
            data = os.read(key.fd, 1 << 16)
            if data:
                job.buffer += data
                *lines, job.buffer = job.buffer.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    if "case" in message:
                        job.case = message["case"]
                    elif "error" in message:
                        job.error = message["error"]
                    else:
                        job.result = message["result"]
                continue
            yield job.index, self._reap(job, timed_out=False)
        now = time.monotonic()
        for job in [j for j in self.running.values() if now - j.started > self.timeout]:
            os.kill(job.pid, signal.SIGKILL)
            yield job.index, self._reap(job, timed_out=True)

    def _reap(self, job: _Job, timed_out: bool) -> dict:
        self.selector.unregister(job.fd)
        os.close(job.fd)
        del self.running[job.fd]
        _, status, usage = os.wait4(job.pid, 0)
        self.seconds[job.index] = time.monotonic() - job.started
        self.cpu[job.index] = usage.ru_utime + usage.ru_stime
        case = None if job.case is None else self.state.cases[job.case].id
        if timed_out:
            return {"timeout": {"case": case, "message": f"still running after {self.timeout:g} s (in case {case})"}}
        if job.result is not None:
            return job.result
        if os.WIFSIGNALED(status):
            why = f"the child died of signal {os.WTERMSIG(status)}"
        else:
            why = f"the child exited with status {os.WEXITSTATUS(status)} without a result"
        if job.error:
            why += f" ({job.error})"
        return {"killed": {"kind": "crash", "case": case, "check": None, "message": why}}

    def close(self):
        for job in list(self.running.values()):
            os.kill(job.pid, signal.SIGKILL)
            self._reap(job, timed_out=True)
        self.selector.close()


# =================================================================== campaign
@dataclass
class Outcome:
    mutant: Mutant
    status: str
    killed_by: Optional[dict] = None
    argument: Optional[str] = None
    message: Optional[str] = None
    adapter: Optional[str] = None  # the adapter whose check (or call) killed it
    adapters: tuple = ()  # the adapters whose unmutated cells ran its lines (a package with cell_reach)
    cells: tuple = ()  # (cells it ran, cells whose unmutated run evaluated it) (a package with cell_reach)

    def record(self) -> dict:
        m = self.mutant
        d = {
            "id": m.id,
            "file": f"{m.package}/{m.file}",
            "function": m.function,
            "line": m.line,
            "col": m.col,
            "operator": m.operator,
            "original": m.original,
            "mutated": m.mutated,
            "rules": list(m.rules),
            "status": self.status,
        }
        if self.killed_by is not None:
            d["killed_by"] = self.killed_by
        if self.adapter is not None:
            d["adapter"] = self.adapter
        if self.adapters:
            d["adapters"] = list(self.adapters)
        if self.cells:
            d["cells"] = list(self.cells)
        if self.argument is not None:
            d["argument"] = self.argument
        if self.message is not None:
            d["message"] = self.message
        return d


@dataclass
class Campaign:
    targets: list
    case_ids: list
    checks: int  # checks of the unmutated run
    outcomes: list
    stale: list  # (id, why)
    mutant_patterns: list = field(default_factory=list)
    other_dtype_cases: list = field(default_factory=list)  # catalog cases without a float64 cell
    package: str = PACKAGE
    kernels: list = field(default_factory=list)  # the names of the kernels run (default: every kernel)
    adapters: dict = field(default_factory=dict)  # load name -> adapter name, for the adapters run
    #: wall seconds of the children: "baseline", and per status of the mutants that ran (not in the reports)
    seconds: dict = field(default_factory=dict, compare=False)
    cpu_seconds: dict = field(default_factory=dict, compare=False)  # their CPU seconds (user and system), likewise
    max_cells: Optional[int] = None  # --max-cells: a mutant ran at most this many of its cells
    trust_arguments: bool = False  # --trust-arguments: the argued mutants were built, not run

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def totals(self) -> dict:
        out = {"generated": len(self.outcomes)}
        out.update({s: self.count(s) for s in STATUSES})
        return out

    @property
    def unargued_survivors(self) -> list:
        return [o for o in self.outcomes if o.status == "survived"]

    @property
    def unclaimed_kills(self) -> list:
        """Mutants that only checks claiming none of their rules caught: a rule claim the catalog lacks."""
        return [o for o in self.outcomes if o.status == "killed-unclaimed"]


def load_unreached(path: pathlib.Path = UNREACHED_FILE) -> dict:
    """The reasons, per "<file>:<function>", why the catalog does not reach some code."""
    return _load_arguments(path, "a JSON object mapping <file>:<function> to one-line reasons")


def unexplained_unreached(c) -> list:
    """The "<file>:<function>" groups of unreached mutants that the package's unreached.json gives no reason for."""
    reasons = load_unreached(PACKAGES[c.package].data_dir / UNREACHED_FILE.name)
    groups = {f"{o.mutant.id_file}:{o.mutant.function}" for o in c.outcomes if o.status == "unreached"}
    return sorted(g for g in groups if g not in reasons)


def load_equivalent(path: pathlib.Path = EQUIVALENT_FILE) -> dict:
    return _load_arguments(path, "a JSON object mapping mutant ids to one-line arguments")


def _load_arguments(path: pathlib.Path, expected: str) -> dict:
    """A JSON object of strings to strings; {} when the file does not exist."""
    path = pathlib.Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise _bad(str(path), expected, f"invalid JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise _bad(str(path), expected, type(data).__name__)
    return data


def select_mutants(mutants: list[Mutant], patterns: Optional[list]) -> list[Mutant]:
    if not patterns:
        return mutants
    chosen = []
    for p in patterns:
        if not any(fnmatch.fnmatchcase(m.id, p) for m in mutants):
            raise _bad("--mutant", "a pattern matching generated mutant ids (see --list)", repr(p))
    for m in mutants:
        if any(fnmatch.fnmatchcase(m.id, p) for p in patterns):
            chosen.append(m)
    return chosen


def _reached(m: Mutant, lines: set) -> bool:
    first, last = m.reach or (m.line, m.end_line)
    return any((m.file, n) in lines for n in range(first, last + 1))


def _compile(m: Mutant, root: pathlib.Path, sources: dict):
    filename = str(root / m.file)
    return m.module, filename, compile(mutated_tree(sources[m.file], m), filename, "exec", dont_inherit=True)


def _adapter_names(load_names) -> dict:
    """load name -> the adapter's name (what its results and deviations carry), without instantiating it."""
    from .adapters import BUILTIN, _load_spec

    return {n: _load_spec(BUILTIN.get(n, n)).name for n in load_names}


def select_kernels(kernels: Optional[list], package: str = PACKAGE) -> list:
    """The kernels ``--kernel`` names within one package (all of them when none is named)."""
    p = _package(package)
    names = [k.name for k in p.kernels]
    for k in kernels or ():
        if k not in names:
            raise _bad("--kernel", f"a kernel of {p.name} ({', '.join(names)})", repr(k))
    return [n for n in names if not kernels or n in kernels]


def run_campaign(
    *,
    targets: Optional[list] = None,
    mutant_patterns: Optional[list] = None,
    cases: Optional[list] = None,
    jobs: int = DEFAULT_JOBS,
    timeout: float = DEFAULT_TIMEOUT,
    equivalent: Optional[dict] = None,
    goldens: Optional[pathlib.Path] = None,
    progress: Optional[Callable[..., Optional[Callable[[str], None]]]] = None,
    package: str = PACKAGE,
    kernels: Optional[list] = None,
    max_cells: Optional[int] = None,
    trust_arguments: bool = False,
) -> Campaign:
    """Generate, run and classify the mutants of one package (POSIX: each mutant runs in a forked child).

    ``targets`` are --target values, ``mutant_patterns`` --mutant values,
    ``cases`` a list of catalog cases (default: all), ``equivalent`` the
    mapping of equivalent.json; ``package`` a name of ``PACKAGES``,
    ``kernels`` the names of its kernels to run (default: all; the files
    only other kernels run are then out of scope); ``max_cells`` the most
    cells a mutant runs, the first of its order (None: every cell that
    evaluated it); ``trust_arguments`` builds the argued mutants but runs
    none of them (each is reported as argued, not run: no stale argument
    of the "killed" kind can then show); ``progress(total, name)`` may
    return a callable that is called with each mutant id as it finishes.
    """
    from .catalog import CASES
    from .runner import load_deviations
    from .store import GOLDEN_DIR, GoldenError, load_case, load_manifest

    if not hasattr(os, "fork"):
        raise RuntimeError("the mutation campaign forks one child per mutant: it needs a POSIX system")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise _bad("--jobs", "an integer >= 1", jobs)
    if not timeout > 0:
        raise _bad("--timeout", "a positive number of seconds", timeout)
    if max_cells is not None and (isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1):
        raise _bad("--max-cells", "an integer >= 1", max_cells)
    if not isinstance(trust_arguments, bool):
        raise _bad("--trust-arguments", "True or False", repr(trust_arguments))
    if package not in PACKAGES:
        raise _bad("--package", f"one of {', '.join(PACKAGES)}", repr(package))
    p = PACKAGES[package]
    chosen_kernels = select_kernels(kernels, p)
    adapters = tuple(dict.fromkeys(a for k in p.kernels if k.name in chosen_kernels for a in k.adapters))
    adapter_names = _adapter_names(adapters)
    root = package_dir(p.name)
    files = scope_files(root, p)
    chosen_files = select_targets(targets, kernel_files(files, p, kernels), p)
    sources = {f: (root / f).read_text(encoding="utf-8") for f in chosen_files}
    mutants = select_mutants([m for f in chosen_files for m in generate(sources[f], f, p.name)], mutant_patterns)
    equivalent = dict(equivalent or {})
    cases = list(CASES) if cases is None else list(cases)
    other_dtype_cases = [c.id for c in cases if cell_dtype(c) is None]
    cases = [c for c in cases if cell_dtype(c) is not None]

    directory = pathlib.Path(goldens or GOLDEN_DIR)
    manifest = load_manifest(directory)
    entries, tensors = [], []
    for case in cases:
        if case.id not in manifest["cases"]:
            raise GoldenError(f"{case.id}: missing from the goldens; run `python -m conformance generate`")
        entries.append(manifest["cases"][case.id])
        tensors.append(load_case(case.id, entries[-1], directory))
    deviations = [d for d in load_deviations() if d.adapter in adapter_names.values()]
    trace_files = {os.path.realpath(root / f): f for f in files}
    state = _State(
        cases, entries, tensors, deviations, trace_files, p.name, adapters, _compile_package(p.name), max_cells
    )
    for name in p.preload:  # imported once here, so that no child imports it again; nothing of it runs here
        importlib.import_module(name)
    if p.before_fork is not None:
        p.before_fork()
    n = len(adapters)
    gc.freeze()  # what the parent holds now: no child's garbage collection touches (and so copies) it
    try:
        baseline, seconds, cpu_seconds = _baseline(state, n, jobs)
        if baseline is None or "lines" not in baseline or baseline.get("failures"):
            problem = (baseline or {}).get("failures") or [(baseline or {}).get("killed") or baseline]
            raise RuntimeError(f"the unmutated {p.name} does not pass the selected cases: {problem[:3]}")
        lines = {(f, line) for f, line in baseline["lines"]}
        reach = _Reach(baseline, sources, len(cases) * n, _mentions(root, p.name)) if p.cell_reach else None
        outcomes: dict = {}
        runnable, cells = [], []
        for m in mutants:
            allowed = None if reach is None else reach.cells(m)
            if not _reached(m, lines) or allowed is not None and not allowed:
                outcomes[m.id] = Outcome(m, "unreached", argument=equivalent.get(m.id))
                continue
            runnable.append(m)
            cells.append(allowed)
        step = progress(len(runnable), p.name) if progress else None
        trusted = {i for i, m in enumerate(runnable) if m.id in equivalent} if trust_arguments else set()
        results, took = _run_mutants(state, runnable, cells, jobs, timeout, root, sources, step, trusted)
    finally:
        gc.unfreeze()
    for m, allowed, result, (wall, cpu) in zip(runnable, cells, results, took):
        ran = () if allowed is None else tuple(adapter_names[adapters[a]] for a in sorted({c % n for c in allowed}))
        counted = () if allowed is None or "ran" not in result else (result["ran"], len(allowed))
        if "build" in result:
            outcomes[m.id] = Outcome(m, "error-on-build", message=result["build"], adapters=ran)
        elif "timeout" in result:
            outcomes[m.id] = Outcome(m, "timeout", killed_by=result["timeout"], adapters=ran)
        elif result.get("killed"):
            killed = dict(result["killed"])
            adapter = killed.pop("adapter", None)
            status = "killed" if killed.get("by_rule", True) else "killed-unclaimed"
            outcomes[m.id] = Outcome(m, status, killed_by=killed, adapter=adapter, adapters=ran, cells=counted)
        elif m.id in equivalent:
            outcomes[m.id] = Outcome(
                m, "equivalent", argument=equivalent[m.id], adapters=ran, cells=counted, message=result.get("trusted")
            )
        else:
            outcomes[m.id] = Outcome(m, "survived", adapters=ran, cells=counted)
        status = outcomes[m.id].status
        seconds[status] = seconds.get(status, 0.0) + wall
        cpu_seconds[status] = cpu_seconds.get(status, 0.0) + cpu
    ordered = [outcomes[m.id] for m in mutants]
    stale = stale_equivalent(equivalent, ordered, [p.id_prefix + f for f in chosen_files], mutant_patterns)
    return Campaign(
        chosen_files,
        [c.id for c in cases],
        baseline["checks"],
        ordered,
        stale,
        list(mutant_patterns or []),
        other_dtype_cases,
        p.name,
        chosen_kernels,
        adapter_names,
        seconds,
        cpu_seconds,
        max_cells,
        trust_arguments,
    )


def _baseline(state: "_State", adapters: int, jobs: int = 1) -> tuple:
    """The unmutated package through every cell under the tracer, in ``jobs`` children that split the cases
    between them (every adapter of a case in one child): (their results merged, {"baseline": the wall seconds
    of the slowest}, {"baseline": their CPU seconds}). A child's result lacking "lines" (a kill, a crash) is
    returned as it is."""
    pool = _Pool(state, jobs, BASELINE_TIMEOUT)
    outcomes: dict = {}
    try:
        for k in range(jobs):
            cells = [(i, a) for i in range(k, len(state.cases), jobs) for a in range(adapters)]
            if cells or k == 0:
                pool.start(-1 - k, None, cells, stop_early=False, trace=True)
        while pool.running:
            for index, outcome in pool.finished():
                outcomes[index] = outcome
    finally:
        pool.close()
    seconds = {"baseline": max(pool.seconds.values(), default=0.0)}
    cpu_seconds = {"baseline": sum(pool.cpu.values())}
    results = [outcomes.get(index) for index in sorted(outcomes, reverse=True)]
    broken = next((r for r in results if r is None or "lines" not in r), None)
    if broken is not None or not results:
        return broken, seconds, cpu_seconds
    return _merge_baselines(results), seconds, cpu_seconds


#: The unmutated run's children may run long (every cell, under the tracer).
BASELINE_TIMEOUT = 3600.0


def _merge_baselines(results: list) -> dict:
    """One baseline result from those of children that ran disjoint cells: checks summed, failures joined, and
    each line's or instruction span's cells united."""
    out: dict = {"killed": None, "checks": 0, "failures": [], "lines": set()}
    reach: dict = {}
    spans: dict = {}
    for r in results:
        out["checks"] += r["checks"]
        out["failures"] += r["failures"]
        out["lines"].update(tuple(x) for x in r["lines"])
        for rel, line, numbers in r.get("reach", ()):
            reach.setdefault((rel, line), set()).update(numbers)
        for *span, numbers in r.get("spans", ()):
            spans.setdefault(tuple(span), set()).update(numbers)
    out["lines"] = sorted(out["lines"])
    if any("reach" in r for r in results):
        out["reach"] = [[rel, line, sorted(numbers)] for (rel, line), numbers in sorted(reach.items())]
        out["spans"] = [[*span, sorted(numbers)] for span, numbers in sorted(spans.items())]
    return out


class _Reach:
    """Which (case, adapter) cells of the unmutated run evaluated a mutant's node (a package with cell_reach).

    A node evaluated in no cell cannot change any cell's result. That the node ran is read from the bytecode
    instructions that ran: an instruction whose source span lies inside the node's is part of it (a branch
    that a line shares with code that ran, such as the 16-bit path of ``x if c else y``, is not). A node with
    no instruction of its own (a constant folded into a tuple), a default value (evaluated at the definition,
    used when the body runs) and module-level code fall back to the lines: every cell that ran one of the
    mutant's lines, every cell when the import did, but for a module constant (``NAME = value``, the name
    mentioned nowhere else): it counts by the instructions that read its name. Cells are numbered case *
    adapters + adapter.
    """

    def __init__(self, baseline: dict, sources: dict, total: int, names: Optional[dict] = None):
        self.total = total
        self.lines = {(f, line): numbers for f, line, numbers in baseline.get("reach", ())}
        self.ran: dict = {}  # rel -> start line -> [(span, numbers)]
        for rel, line, col, end_line, end_col, numbers in baseline.get("spans", ()):
            self.ran.setdefault(rel, {}).setdefault(line, []).append(((line, col, end_line, end_col), numbers))
        self.compiled = {rel: _instruction_spans(source, rel) for rel, source in sources.items()}
        self.sources, self.trees = sources, {}
        self.names = names or {}  # identifier -> the files (package and conformance code) that mention it

    def cells(self, m: Mutant) -> frozenset:
        first, last = m.reach or (m.line, m.end_line)
        own = (first, last) == (m.line, m.end_line) and m.end_col >= 0
        compiled = self.compiled.get(m.file, {})
        start, end = (m.line, m.col), (m.end_line, m.end_col)
        numbers: set = set()
        reads = self.constant_reads(m) if m.function == "<module>" else None
        if reads is not None:  # a module constant: the cells that read it
            for span in reads:
                numbers.update(self.ran_inside(m.file, span))
        elif own and any(
            _inside(span, start, end) for line in range(m.line, m.end_line + 1) for span in compiled.get(line, ())
        ):
            numbers.update(self.ran_inside(m.file, (*start, *end)))
        else:
            for line in range(first, last + 1):
                numbers.update(self.lines.get((m.file, line), ()))
        if -1 in numbers:
            return frozenset(range(self.total))
        return frozenset(numbers)

    def ran_inside(self, rel: str, span: tuple) -> set:
        """The cells in which an instruction of the source span (line, col, end_line, end_col) ran."""
        out: set = set()
        for line in range(span[0], span[2] + 1):
            for ran_span, numbers in self.ran.get(rel, {}).get(line, ()):
                if _inside(ran_span, span[:2], span[2:]):
                    out.update(numbers)
        return out

    def constant_reads(self, m: Mutant) -> Optional[list]:
        """For a mutant of a module-level ``NAME = value`` whose value calls nothing but the builtin containers and
        whose name no other module of the package (nor the conformance code) mentions: the spans of the module's
        reads of NAME (a changed value matters only where it is read). None for any other mutant."""
        if not m.path or m.path[0][0] != "body":
            return None
        if m.file not in self.trees:
            self.trees[m.file] = ast.parse(self.sources[m.file])
        tree = self.trees[m.file]
        stmt = tree.body[m.path[0][1]]
        targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else getattr(stmt, "targets", [])
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or m.replacement is None or stmt.value is None:
            return None
        pure = all(
            isinstance(n.func, ast.Name) and n.func.id in PURE_CALLS
            for n in ast.walk(stmt.value)
            if isinstance(n, ast.Call)
        )
        name = targets[0].id
        if not pure or self.names.get(name, set()) - {m.file}:
            return None
        return [
            (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset)
            for n in ast.walk(tree)
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        ]


#: The calls a module constant's value may make and still be read only through its name.
PURE_CALLS = frozenset({"frozenset", "tuple", "dict", "set", "list", "len", "int", "float"})


def _mentions(root: pathlib.Path, package: str) -> dict:
    """identifier -> the files that mention it: each module of the package (relative to it) and, as one file,
    the conformance code (which the children run too)."""
    out: dict = {}
    texts = [(p.relative_to(root).as_posix(), p) for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    texts += [("<conformance>", p) for p in HERE.rglob("*.py") if "__pycache__" not in p.parts]
    for rel, path in texts:
        for word in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(encoding="utf-8"))):
            out.setdefault(word, set()).add(rel)
    return out


def _inside(span: tuple, start: tuple, end: tuple) -> bool:
    """Whether the source span (line, col, end_line, end_col) lies within start (line, col) .. end."""
    return start <= span[:2] and span[2:] <= end


def _instruction_spans(source: str, rel: str) -> dict:
    """start line -> the source spans (line, col, end_line, end_col) of the instructions a module compiles to
    (its nested code objects too): where a node has instructions of its own."""
    out: dict = {}
    stack = [compile(source, rel, "exec", dont_inherit=True)]
    while stack:
        code = stack.pop()
        for line, end_line, col, end_col in code.co_positions():
            if None not in (line, end_line, col, end_col):
                out.setdefault(line, set()).add((line, col, end_line, end_col))
        stack.extend(c for c in code.co_consts if isinstance(c, type(code)))
    return out


#: The result of an argued mutant that ``--trust-arguments`` builds but does not run (its report's message).
TRUSTED = "not run (--trust-arguments): argued equivalent, built only"


def _run_mutants(state, runnable, cells, jobs, timeout, root, sources, step, trusted=frozenset()) -> tuple:
    """Run every mutant; mutant i orders the cases by the kills of mutants 0 .. i - WINDOW, and runs the cells of
    ``cells[i]`` (None: all) in that order; a mutant whose index is in ``trusted`` is built and not run (it kills
    nothing, as a survivor would: the others' order is the same either way). (results, (wall, CPU) seconds of
    each child)"""
    n = len(runnable)
    results: list = [None] * n
    kills = [0] * len(state.cases)
    index_of = {c.id: i for i, c in enumerate(state.cases)}
    adapters = len(state.adapters)
    counted = 0  # results[0:counted] are in kills
    pool = _Pool(state, jobs, timeout)
    try:
        next_index = 0
        while next_index < n or pool.running:
            while next_index < n and len(pool.running) < jobs:
                while counted <= next_index - WINDOW and results[counted] is not None:
                    killed = results[counted].get("killed")
                    if killed and killed.get("case") in index_of and killed["kind"] in ("check", "exception"):
                        kills[index_of[killed["case"]]] += 1
                    counted += 1
                if counted <= next_index - WINDOW:
                    break  # wait for an earlier mutant: the case order must not depend on --jobs
                m = runnable[next_index]
                try:
                    module = _compile(m, root, sources)
                except Exception as e:
                    results[next_index] = {"build": _describe_exception(e)}
                else:
                    if next_index in trusted:
                        results[next_index] = {"trusted": TRUSTED}
                if results[next_index] is not None:  # did not build, or built and trusted: nothing to run
                    if step:
                        step(m.id)
                    next_index += 1
                    continue
                order = sorted(range(len(state.cases)), key=lambda i: (-kills[i], i))
                allowed = cells[next_index]
                order = [
                    (i, a) for i in order for a in range(adapters) if allowed is None or i * adapters + a in allowed
                ]
                pool.start(next_index, module, order, rules=m.rules)
                next_index += 1
            for index, outcome in pool.finished():
                results[index] = outcome
                if step:
                    step(runnable[index].id)
    finally:
        pool.close()
    return results, [(pool.seconds.get(i, 0.0), pool.cpu.get(i, 0.0)) for i in range(n)]


def stale_equivalent(equivalent: dict, outcomes: list, files: list, patterns: Optional[list]) -> list:
    """(id, why) for every argued id in scope that is killed or no longer generated."""
    by_id = {o.mutant.id: o for o in outcomes}
    stale = []
    for mutant_id in sorted(equivalent):
        rel = mutant_id.split(":", 1)[0]
        if rel not in files or (patterns and not any(fnmatch.fnmatchcase(mutant_id, p) for p in patterns)):
            continue
        o = by_id.get(mutant_id)
        if o is None:
            stale.append((mutant_id, "no longer generated"))
        elif o.status in ("killed", "killed-unclaimed", "timeout"):
            k = o.killed_by or {}
            what = f"{k.get('case')} / {k.get('check')}" if k.get("check") else f"{k.get('case')} ({k.get('kind')})"
            stale.append((mutant_id, "killed by timeout" if o.status == "timeout" else f"{o.status} by {what}"))
        elif o.status == "error-on-build":
            stale.append((mutant_id, "does not build"))
    return stale


# ===================================================================== report
def _code(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > 90:
        text = text[:87] + "..."
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


REPRODUCE = (
    ("the full campaign", "python -m conformance campaign --jobs 2"),
    ("one file", "python -m conformance campaign --target masking.py --report-dir /tmp/campaign"),
    ("one mutant", "python -m conformance campaign --mutant 'ID' --report-dir /tmp/campaign"),
    ("a mutant as a diff", "python -m conformance campaign --show 'ID'"),
    ("every mutant, without running", "python -m conformance campaign --list"),
)
#: The same, for a package other than numpy_ref ({package}; {kernel}: one of its kernels; {file}: one of its files).
REPRODUCE_PACKAGE = (
    ("the full campaign", "python -m conformance campaign --package {package} --jobs 2"),
    ("one kernel", "python -m conformance campaign --kernel {kernel} --report-dir /tmp/campaign"),
    ("one file", "python -m conformance campaign --target {package}/{file} --report-dir /tmp/campaign"),
    ("one mutant", "python -m conformance campaign --mutant 'ID' --report-dir /tmp/campaign"),
    ("a mutant as a diff", "python -m conformance campaign --show 'ID'"),
    ("every mutant, without running", "python -m conformance campaign --package {package} --list"),
)


def _how_it_runs(c: Campaign) -> str:
    """The report's paragraph on how the mutants ran."""
    p = PACKAGES[c.package]
    if c.package == PACKAGE:
        return (
            "Each mutant is one "
            "AST change of a numpy_ref file, run against the conformance catalog with the `numpy` adapter on cpu, "
            "each case in float64 (float32 where it is stored in float32 only); it is killed when a check claiming a "
            "rule its function's docstring names fails. " + _trust_note(c)
        )
    names = ", ".join(f"`{c.adapters.get(a, a)}`" for a in p.adapters if a in c.adapters)
    notes = " ".join(f"{k.name} runs {k.note}." for k in p.kernels if k.note and k.name in c.kernels)
    return (
        f"Each mutant is one AST change of a {p.name} file, run against the conformance catalog through the adapters "
        f"of the kernels that run it ({names}) on cpu, in the (case, adapter) cells whose unmutated run executed "
        "the mutated lines (every cell for module-level code), each case in float64 (float32 where it is stored in "
        f"float32 only). {notes} A mutant is killed when a check claiming a rule its function's docstring names "
        "fails. "
        + (
            f"Each mutant ran at most {c.max_cells} of those cells, the first of its order (--max-cells). "
            if c.max_cells
            else ""
        )
        + _trust_note(c)
    )


def _trust_note(c: Campaign) -> str:
    if not c.trust_arguments:
        return ""
    return (
        "The argued mutants were built and not run (--trust-arguments): each stands on its argument alone, and "
        "an argument whose mutant a check now kills shows only in a run without that option. "
    )


def _reproduce(c: Campaign) -> tuple:
    if c.package == PACKAGE:
        return REPRODUCE
    p = PACKAGES[c.package]
    own = next((k for k in p.kernels if k.files), p.kernels[0])
    file = own.files[0] if own.files else (c.targets[0] if c.targets else "FILE")
    return tuple((what, cmd.format(package=p.name, kernel=own.name, file=file)) for what, cmd in REPRODUCE_PACKAGE)


def render_markdown(c: Campaign) -> str:
    t = c.totals()
    out = [
        f"# Mutation campaign over {c.package}",
        "",
        "Written by `python -m conformance campaign` (conformance/campaign.py); do not edit. "
        + _how_it_runs(c)
        + "A survivor is either equivalent (it cannot change any "
        "result the spec defines; the argument is in "
        f"`{PACKAGES[c.package].data_dir.relative_to(HERE).as_posix()}/equivalent.json`) or a test input the catalog "
        "lacks.",
        "",
        f"Scope: {len(c.targets)} files ({', '.join(c.targets)}), {len(c.case_ids)} cases, "
        f"{c.checks} checks on the unmutated {'reference' if c.package == PACKAGE else 'kernels'}"
        + (f"; mutants matching {', '.join(c.mutant_patterns)}" if c.mutant_patterns else "")
        + "."
        + (
            f" Not run: {len(c.other_dtype_cases)} cases without a float64 or float32 cell"
            f" ({', '.join(c.other_dtype_cases)})."
            if c.other_dtype_cases
            else ""
        ),
        "",
        "## Totals",
        "",
        "| status | mutants |",
        "| --- | ---: |",
        f"| generated | {t['generated']} |",
    ]
    out += [f"| {s} | {t[s]} |" for s in STATUSES]
    columns = ("killed", "killed-unclaimed", "timeout", "survived", "equivalent", "unreached")
    out += ["", "By file:", "", "| file | generated | " + " | ".join(columns) + " |"]
    out += ["| --- | ---: |" + " ---: |" * len(columns)]
    for f in c.targets:
        rows = [o for o in c.outcomes if o.mutant.file == f]
        counts = [sum(o.status == s for o in rows) for s in columns]
        out.append(f"| {c.package}/{f} | {len(rows)} | " + " | ".join(map(str, counts)) + " |")
    if len(PACKAGES[c.package].kernels) > 1:
        out += [
            "",
            "By kernel: its own files' mutants; then, of the shared files' mutants, those its cells ran and those it "
            "killed first (each case runs through the adapters in the order of this table).",
        ]
        out += ["", "| kernel | adapter | own files | generated | " + " | ".join(columns) + " | shared: ran | "]
        out[-1] += "shared: killed |"
        out += ["| --- | --- | --- | ---: |" + " ---: |" * (len(columns) + 2)]
        for row in kernel_rows(c):
            counts = [row["own"][s] for s in ("generated", *columns)]
            out.append(
                f"| {row['kernel']} | {', '.join(f'`{a}`' for a in row['adapters'])} | "
                f"{', '.join(row['files']) or '-'} | " + " | ".join(map(str, counts)) + " | "
                f"{row['shared_ran']} | {row['shared_killed']} |"
            )
    survivors = [o for o in c.outcomes if o.status in ("survived", "equivalent")]
    out += ["", f"## Survivors ({len(survivors)})", ""]
    if survivors:
        out += ["| where | id | original -> mutated | verdict |", "| --- | --- | --- | --- |"]
        for o in survivors:
            m = o.mutant
            verdict = f"EQUIVALENT: {o.argument}" if o.status == "equivalent" else "SURVIVED"
            out.append(
                f"| {m.where} | `{m.id}` | {_code(m.original)} -> {_code(m.mutated)} | {verdict.replace('|', '/')} |"
            )
    else:
        out.append("None.")
    unclaimed = c.unclaimed_kills
    out += ["", f"## Killed by a check claiming none of the mutant's rules ({len(unclaimed)})", ""]
    out.append(
        "A mutant's rules are those its function's docstring names (else its class's, else its module's). A check "
        "claiming rule X promises to fail when X is broken; a mutant that only other checks catch is a claim the "
        "catalog lacks (or a docstring that does not name the rule its code implements)."
    )
    if unclaimed:
        out += ["", "| where | id | original -> mutated | rules | caught by |", "| --- | --- | --- | --- | --- |"]
        for o in unclaimed:
            m, k = o.mutant, o.killed_by or {}
            out.append(
                f"| {m.where} | `{m.id}` | {_code(m.original)} -> {_code(m.mutated)} | {', '.join(m.rules)} | "
                f"{k.get('case')} / {k.get('check') or k.get('kind')} |"
            )
    else:
        out += ["", "None."]
    for status, title in (("timeout", "Killed by timeout"), ("error-on-build", "Errors on build")):
        rows = [o for o in c.outcomes if o.status == status]
        if rows:
            out += ["", f"## {title} ({len(rows)})", ""]
            for o in rows:
                why = (o.killed_by or {}).get("message") or o.message or ""
                out.append(
                    f"- {o.mutant.where} `{o.mutant.id}`: {_code(o.mutant.original)} -> "
                    f"{_code(o.mutant.mutated)} ({why})"
                )
    unreached = [o for o in c.outcomes if o.status == "unreached"]
    out += ["", f"## Unreached ({len(unreached)})", ""]
    out.append(
        "Mutants on lines that the unmutated catalog never executes: coverage findings of the catalog, not kills."
    )
    groups: dict = {}
    for o in unreached:
        groups.setdefault((o.mutant.file, o.mutant.function), []).append(o)
    reasons = load_unreached(PACKAGES[c.package].data_dir / UNREACHED_FILE.name)
    for (f, function), rows in groups.items():
        key = f"{PACKAGES[c.package].id_prefix}{f}:{function}"
        out += ["", f"### {c.package}/{f}: {function} ({len(rows)})", ""]
        out += [f"Why unreached: {reasons.get(key, '**no reason given** (unreached.json)')}", ""]
        for o in rows:
            note = f" (argued equivalent: {o.argument})" if o.argument else ""
            out.append(
                f"- line {o.mutant.line} `{o.mutant.id}`: {_code(o.mutant.original)} -> {_code(o.mutant.mutated)}{note}"
            )
    if c.stale:
        out += ["", f"## Stale equivalence arguments ({len(c.stale)})", ""]
        out += [f"- `{i}`: {why}; remove it from equivalent.json" for i, why in c.stale]
    first = {}
    for o in c.outcomes:
        if o.status == "killed" and o.killed_by and o.killed_by.get("case"):
            first[o.killed_by["case"]] = first.get(o.killed_by["case"], 0) + 1
    if first:
        out += ["", "## First killers", "", "The case that killed each mutant first (the order is adaptive).", ""]
        out += ["| case | mutants |", "| --- | ---: |"]
        out += [f"| {case} | {n} |" for case, n in sorted(first.items(), key=lambda x: (-x[1], x[0]))]
    ops: dict = {}
    for o in c.outcomes:
        row = ops.setdefault(o.mutant.operator, {s: 0 for s in STATUSES})
        row[o.status] += 1
    out += ["", "## Operators", "", "| operator | " + " | ".join(STATUSES) + " |"]
    out += ["| --- |" + " ---: |" * len(STATUSES)]
    out += [f"| {op} | " + " | ".join(str(ops[op][s]) for s in STATUSES) + " |" for op in sorted(ops)]
    out += ["", "## Reproduce", ""]
    out += [f"- {what}: `{cmd}`" for what, cmd in _reproduce(c)]
    out += ["", "The campaign forks one child per mutant (POSIX only); `--jobs N` runs N at once."]
    return "\n".join(out) + "\n"


def kernel_rows(c: Campaign) -> list:
    """Per kernel run: its adapters, its own files and their mutants' totals, and the mutants of the shared files
    that its cells ran (``shared_ran``) and that its checks killed (``shared_killed``)."""
    p = PACKAGES[c.package]
    owned = {f for k in p.kernels for f in k.files}
    rows = []
    for k in p.kernels:
        if k.name not in c.kernels:
            continue
        names = [c.adapters.get(a, a) for a in k.adapters]
        own = [o for o in c.outcomes if o.mutant.file in k.files]
        shared = [o for o in c.outcomes if o.mutant.file not in owned]
        totals = {"generated": len(own), **{s: sum(o.status == s for o in own) for s in STATUSES}}
        rows.append(
            {
                "kernel": k.name,
                "adapters": names,
                "files": [f"{p.name}/{f}" for f in k.files],
                "own": totals,
                "shared_ran": sum(bool(set(o.adapters) & set(names)) for o in shared),
                "shared_killed": sum(o.status == "killed" and o.adapter in names for o in shared),
            }
        )
    return rows


def report_json(c: Campaign) -> dict:
    names = [c.adapters[a] for a in PACKAGES[c.package].adapters if a in c.adapters]
    return {
        "package": c.package,
        "scope": {
            "files": [f"{c.package}/{f}" for f in c.targets],
            "cases": c.case_ids,
            "checks": c.checks,
            "cases_without_float64_or_float32": c.other_dtype_cases,
            "max_cells": c.max_cells,
            "trust_arguments": c.trust_arguments,
        },
        "mutant_patterns": c.mutant_patterns,
        "adapter": names[0] if names else "numpy",
        "adapters": names,
        "dtypes": list(DTYPES),
        "device": DEVICE,
        "totals": c.totals(),
        "files": [
            {
                "file": f"{c.package}/{f}",
                "generated": sum(o.mutant.file == f for o in c.outcomes),
                **{s: sum(o.mutant.file == f and o.status == s for o in c.outcomes) for s in STATUSES},
            }
            for f in c.targets
        ],
        "kernels": kernel_rows(c),
        "stale_equivalent": [{"id": i, "why": why} for i, why in c.stale],
        "mutants": [o.record() for o in c.outcomes],
    }


def write_reports(c: Campaign, directory: Optional[pathlib.Path] = None) -> list[pathlib.Path]:
    """report.json and REPORT.md in ``directory`` (default: the package's folder of campaign_data)."""
    directory = pathlib.Path(directory) if directory is not None else PACKAGES[c.package].data_dir
    directory.mkdir(parents=True, exist_ok=True)
    js, md = directory / "report.json", directory / "REPORT.md"
    js.write_text(json.dumps(report_json(c), indent=1, sort_keys=False) + "\n", encoding="utf-8")
    md.write_text(render_markdown(c), encoding="utf-8")
    return [js, md]


# ======================================================================== CLI
def select_packages(args) -> dict:
    """package name -> the names of its kernels to run (None: all), from --package, --kernel and --all; without
    them, the packages that --target, --mutant or --show name by prefix (``torch_impl/...``), else numpy_ref."""
    packages = list(getattr(args, "package", None) or [])
    kernels = list(getattr(args, "kernel", None) or [])
    for name in packages:
        if name not in PACKAGES:
            raise _bad("--package", f"one of {', '.join(PACKAGES)}", repr(name))
    for name in kernels:
        if name not in KERNELS:
            raise _bad("--kernel", f"one of {', '.join(KERNELS)}", repr(name))
    chosen: dict = {name: None for name in PACKAGES} if getattr(args, "all", False) else {}
    chosen.update({name: None for name in packages})
    for name in kernels:
        if chosen.get(KERNELS[name], ()) is not None:  # not already the whole package
            chosen.setdefault(KERNELS[name], []).append(name)
    if not chosen:
        named = list(args.target or []) + list(args.mutant or []) + ([args.show] if args.show else [])
        chosen = {p: None for p in PACKAGES if p != PACKAGE and any(x.startswith(p + "/") for x in named)}
    return {p: chosen[p] for p in PACKAGES if p in chosen} or {PACKAGE: None}


def _plan(args, packages: dict) -> list:
    """(package, kernels, files, targets, mutant patterns) per package that the arguments leave something of."""
    single = len(packages) == 1
    plan, used_targets, used_patterns = [], set(), set()
    for name, kernels in packages.items():
        files = kernel_files(scope_files(package=name), name, kernels)
        targets = args.target
        if targets and not single:  # the targets of this package: prefixed with it, or matching one of its files
            targets = [
                t
                for t in targets
                if t.startswith(name + "/")
                or (not any(t.startswith(p + "/") for p in PACKAGES) and any(fnmatch.fnmatchcase(f, t) for f in files))
            ]
            used_targets.update(targets)
            if not targets:
                continue
        chosen = select_targets(targets, files, name)
        patterns = args.mutant
        if patterns and not single:
            ids = [m.id for m in generate_files(chosen, package=name)]
            patterns = [x for x in patterns if any(fnmatch.fnmatchcase(i, x) for i in ids)]
            used_patterns.update(patterns)
            if not patterns:
                continue
        plan.append((name, kernels, chosen, targets, patterns))
    for t in args.target or ():
        if not single and t not in used_targets:
            scopes = " or ".join(f"{p}/" for p in packages)
            raise _bad("--target", f"a file in the campaign's scope of {scopes} or a pattern matching one", repr(t))
    for x in args.mutant or ():
        if not single and x not in used_patterns:
            raise _bad("--mutant", "a pattern matching generated mutant ids (see --list)", repr(x))
    return plan


def main(args, progress=None) -> int:
    """``python -m conformance campaign``: see ``conformance.cli``."""
    plan = _plan(args, select_packages(args))
    if args.show or args.list:
        for name, _, chosen, _, patterns in plan:
            root = package_dir(name)
            mutants = select_mutants(generate_files(chosen, root, name), patterns)
            if args.show:
                hit = [m for m in mutants if m.id == args.show]
                if hit:
                    m = hit[0]
                    print(f"{m.id}  {m.where}  {m.original} -> {m.mutated}")
                    print(diff(m, root), end="")
                    return 0
                continue
            for m in mutants:
                print(f"{m.id:60s} {m.line:4d}  {' '.join(m.original.split())} -> {' '.join(m.mutated.split())}")
            print(f"{len(mutants)} mutants in {len(chosen)} files" + (f" of {name}" if name != PACKAGE else ""))
        if args.show:
            raise _bad("--show", "the id of a generated mutant (see --list)", repr(args.show))
        return 0
    failed = False
    for name, kernels, _, targets, patterns in plan:
        p = PACKAGES[name]
        equivalent_path = pathlib.Path(args.equivalent) if args.equivalent else p.data_dir / EQUIVALENT_FILE.name
        report_dir = pathlib.Path(args.report_dir) / p.subdir if args.report_dir else p.data_dir
        started = time.monotonic()
        c = run_campaign(
            targets=targets,
            mutant_patterns=patterns,
            jobs=args.jobs,
            timeout=p.timeout if args.timeout is None else args.timeout,
            equivalent=load_equivalent(equivalent_path),
            goldens=pathlib.Path(args.goldens),
            progress=progress,
            package=name,
            kernels=kernels,
            max_cells=getattr(args, "max_cells", None),
            trust_arguments=getattr(args, "trust_arguments", False),
        )
        elapsed = time.monotonic() - started
        failed |= _summary(c, report_dir, elapsed)
    return 1 if failed and not args.allow_survivors else 0


def _summary(c: Campaign, report_dir: pathlib.Path, elapsed: float) -> bool:
    """Write the reports, print the totals and every finding; whether the campaign failed."""
    for path in write_reports(c, report_dir):
        print(f"wrote {path}")
    t = c.totals()
    over = "" if c.package == PACKAGE else f" over {c.package} ({', '.join(c.kernels)})"
    print(
        f"mutation campaign{over}: {t['generated']} mutants in {len(c.targets)} files, {len(c.case_ids)} cases: "
        f"{t['killed']} killed by rule, {t['killed-unclaimed']} killed by checks claiming none of their rules, "
        f"{t['timeout']} timeouts, {t['survived']} survived, {t['equivalent']} equivalent, "
        f"{t['unreached']} unreached, {t['error-on-build']} errors on build ({elapsed:.0f} s)"
        + (f"; the {t['equivalent']} argued were built, not run (--trust-arguments)" if c.trust_arguments else "")
    )
    if c.seconds:
        for what, times in (("wall", c.seconds), ("CPU", c.cpu_seconds)):
            spent = ", ".join(f"{status} {t:.0f} s" for status, t in times.items() if status != "baseline")
            print(f"  children's {what} time: the unmutated run {times.get('baseline', 0.0):.0f} s; mutants {spent}")
    for i, why in c.stale:
        print(f"warning: stale equivalence argument {i}: {why}", file=sys.stderr)
    for o in c.unargued_survivors:
        m = o.mutant
        print(f"  SURVIVED {m.id}  {m.where}  {' '.join(m.original.split())} -> {' '.join(m.mutated.split())}")
    for o in c.unclaimed_kills:
        m, k = o.mutant, o.killed_by or {}
        print(
            f"  KILLED-UNCLAIMED {m.id}  {m.where}  rules {', '.join(m.rules)}; caught only by "
            f"{k.get('case')} / {k.get('check') or k.get('kind')}" + (f" ({o.adapter})" if o.adapter else "")
        )
    unexplained = unexplained_unreached(c)
    for group in unexplained:
        print(f"  UNREACHED without a reason in unreached.json: {group}")
    return bool(c.unargued_survivors or c.unclaimed_kills or unexplained)
