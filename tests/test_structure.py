"""The architecture, checked: schemes are units (REL-3, REL-4), dependencies point one way.

A scheme class may be tested with ``isinstance`` only inside the scheme's own
modules: ``spec/<name>.py`` and ``<backend>/.../schemes/<name>.py`` (or a
``schemes/<name>/`` folder). Everywhere else code reaches a scheme through its
protocol (``param_shapes``, ``hooks``, ``features``, ``to_json``) or through a
backend's registry, so adding a scheme never means editing a dozen files.
"""

import ast
import importlib
import pathlib

import pytest

import spec
from conformance import catalog
from conformance.mutants import MUTANTS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("spec", "numpy_ref", "torch_impl", "jax_impl", "conformance", "benchmarks", "tests")
SCHEMES = spec.scheme_classes()


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _own_module(path: pathlib.Path, scheme_name: str) -> bool:
    rel = path.relative_to(ROOT).parts
    if rel == ("spec", f"{scheme_name}.py"):
        return True
    return any(a == "schemes" and (b == f"{scheme_name}.py" or b == scheme_name) for a, b in zip(rel, rel[1:]))


def _isinstance_targets(node: ast.Call) -> list[str]:
    """The class names tested by isinstance(x, C) / issubclass(x, C) / isinstance(x, (C, D))."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
        return []
    target = node.args[1]
    elts = target.elts if isinstance(target, ast.Tuple) else [target]
    names = []
    for e in elts:
        if isinstance(e, ast.Name):
            names.append(e.id)
        elif isinstance(e, ast.Attribute):
            names.append(e.attr)
    return names


def test_schemes_are_told_apart_only_in_their_own_modules():
    by_class = {cls.__name__: name for name, cls in SCHEMES.items()}
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for cls in _isinstance_targets(node):
                    if cls in by_class and not _own_module(path, by_class[cls]):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} isinstance(..., {cls})")
    assert not offenders, "scheme type tests outside the scheme's own modules:\n" + "\n".join(offenders)


def test_the_isinstance_finder_finds_what_it_must():
    """The check above can fail: it sees plain, attribute and tuple forms."""
    tree = ast.parse("isinstance(r, Shaw)\nisinstance(r, (spec.Huang, int))\nissubclass(t, Shaw)\nlen(x)")
    found = [c for n in ast.walk(tree) if isinstance(n, ast.Call) for c in _isinstance_targets(n)]
    assert found == ["Shaw", "Huang", "int", "Shaw"]


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize(
    "package,forbidden",
    [
        ("spec", {"numpy_ref", "torch_impl", "jax_impl", "conformance", "numpy", "torch", "jax"}),
        ("numpy_ref", {"torch_impl", "jax_impl", "conformance", "torch", "jax"}),
        ("torch_impl", {"numpy_ref", "jax_impl", "conformance", "jax"}),
        ("jax_impl", {"numpy_ref", "torch_impl", "conformance", "torch"}),
    ],
)
def test_dependencies_point_one_way(package, forbidden):
    """spec <- numpy_ref <- conformance; torch_impl and jax_impl depend on spec only (and spec has no numerics)."""
    bad = [
        f"{p.relative_to(ROOT)} imports {sorted(_imports(p) & forbidden)}"
        for p in sorted((ROOT / package).rglob("*.py"))
        if _imports(p) & forbidden
    ]
    assert not bad, "\n".join(bad)


def _backend_modules(name: str) -> dict:
    """Whether each backend's registry knows scheme ``name`` (REL-4): backend -> module or an error."""
    from conformance.naive import schemes as naive_schemes
    from numpy_ref import schemes as ref_schemes

    found = {"numpy_ref": name in ref_schemes.REGISTRY, "conformance.naive": name in naive_schemes.registered()}
    for backend in ("torch_impl", "jax_impl"):
        registry = importlib.import_module(f"{backend}.schemes")
        found[backend] = name in registry.REGISTRY
    return found


@pytest.mark.parametrize("name", list(SCHEMES))
def test_every_scheme_is_complete(name):
    """Each scheme spec exports has a module in every backend, a chapter, a case and a mutant."""
    cls = SCHEMES[name]
    missing = [backend for backend, ok in _backend_modules(name).items() if not ok]
    assert not missing, f"scheme {name!r} has no module in {missing}"
    assert f"{cls.rule_prefix}-1" in spec.rule_ids(), f"scheme {name!r} has no chapter ({cls.rule_prefix}-1..)"
    cases = [c.id for c in catalog.CASES if c.spec.relative is not None and c.spec.relative.name == name]
    assert cases, f"scheme {name!r} has no conformance case"
    mutants = [m for m, cls_ in MUTANTS.items() if cls_.scheme == name]
    assert mutants, f"scheme {name!r} has no mutant (a Mutant subclass with scheme = {name!r})"
    assert set(spec.HOOKS) >= cls(**_smallest_fields(cls)).hooks


def _smallest_fields(cls) -> dict:
    """Constructor arguments for a scheme's required fields (small positive ints)."""
    import dataclasses

    return {
        f.name: 2
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
