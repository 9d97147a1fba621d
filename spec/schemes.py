"""Position schemes as units (rules REL-1, REL-3, REL-4).

A scheme says *what* a relative position encoding adds to attention, through
at most five hooks (HOOKS): a transform of q and k (RoPE), a
query-dependent key term (Shaw keys, Huang), a key-dependent key-side term
(Shaw's ``key_side``), a query-independent bias (ALiBi, T5, Swin) and a
value term (Shaw values, Huang values). *How* it is computed is
each backend's business: every backend (``numpy_ref``, ``torch_impl``,
``jax_impl``, the naive emulation in ``conformance``) has one module per
scheme, found through its own registry by ``Scheme.name``; nothing else
looks at the scheme's type.

A scheme class is a frozen dataclass that subclasses ``Scheme`` and is
registered with ``@register``. It validates its own fields and states its
parameter tables, the hooks it uses and the conformance features it needs.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, ClassVar

__all__ = ["HOOKS", "ModuleRegistry", "Scheme", "register", "unregister", "scheme_classes", "scheme_from_json"]

#: The hook kinds, in the order the core applies them (REL-3).
HOOKS = ("qk_transform", "key_term", "key_side_term", "bias", "value_term")

_REGISTRY: dict[str, type] = {}


class Scheme:
    """The protocol every position scheme implements (REL-3).

    Class attributes:
      name: the registry key, lower case (``"shaw"``); backends look their
        module up by it, and it is the ``"scheme"`` field of the JSON form.
      rule_prefix: the id prefix of the scheme's chapter (``"SHAW"``).
    """

    name: ClassVar[str] = ""
    rule_prefix: ClassVar[str] = ""

    def param_shapes(self, num_heads: int, head_dim: int, value_head_dim: int) -> dict[str, tuple[int, ...]]:
        """The canonical tables this scheme adds (PARAM-1), name -> shape, in canonical order.

        H query heads, d the query/key head size, dv the value head size
        (HEAD-4): a table read with the queries has ``d`` columns, a value-side
        table ``dv``.
        """
        raise NotImplementedError

    def check_sizes(self, num_heads: int, head_dim: int, value_head_dim: int) -> None:
        """Raise ValueError when this configuration cannot serve heads of these sizes (REL-3).

        ``AttentionSpec`` calls it once, at construction; the default accepts every size.
        """

    @property
    def hooks(self) -> frozenset:
        """The hook kinds (from HOOKS) this configuration uses."""
        raise NotImplementedError

    @property
    def features(self) -> frozenset:
        """The conformance features a case with this scheme needs of an adapter."""
        raise NotImplementedError

    def to_json(self) -> dict:
        """A JSON-able dict: ``{"scheme": name, field: value, ...}`` (the goldens' manifest form)."""
        return {"scheme": self.name, **dataclasses.asdict(self)}


def register(cls: type) -> type:
    """Class decorator: add a scheme class to the registry under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, Scheme) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"register: expected a dataclass subclassing spec.Scheme, got {cls!r}")
    if not cls.name or not cls.rule_prefix:
        raise ValueError(
            f"register: {cls.__name__} needs a name and a rule_prefix, got "
            f"name={cls.name!r}, rule_prefix={cls.rule_prefix!r}"
        )
    other = _REGISTRY.get(cls.name)
    if other is not None and other is not cls:
        raise ValueError(f"register: scheme name {cls.name!r} is taken by {other.__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a scheme class from the registry (for outside schemes and tests; the built-in ones stay)."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unregister: expected a registered scheme name ({', '.join(sorted(_REGISTRY))}), got {name!r}"
        )
    del _REGISTRY[name]


def scheme_classes() -> dict[str, type]:
    """Every registered scheme class, name -> class, in registration order."""
    return dict(_REGISTRY)


def scheme_from_json(d: dict) -> Scheme:
    """The inverse of ``Scheme.to_json``."""
    d = dict(d)
    name = d.pop("scheme", None)
    if name not in _REGISTRY:
        raise ValueError(f"scheme: expected one of {sorted(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name](**d)


class ModuleRegistry(dict):
    """One implementation's modules of the schemes, by scheme name (REL-4).

    Each implementation (numpy_ref, torch_impl, jax_impl) keeps one:
    ``name -> module`` (a module object, or a dotted path imported on first
    use). ``module_for(scheme)`` looks a scheme up by its ``name`` and raises
    ``ValueError`` for a scheme the implementation does not have, naming the
    ones it has: an unknown scheme is never treated as a known one.
    """

    def __init__(self, owner: str, modules: dict):
        super().__init__(modules)
        self.owner = owner

    def register_module(self, name: str, module: Any) -> None:
        """Add the module of scheme ``name``; the same module again is a no-op, another one a ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"register_module: expected a non-empty scheme name, got {name!r}")
        other = self.get(name)
        if other is not None and other is not module:
            raise ValueError(f"register_module: scheme name {name!r} already has the module {_module_name(other)}")
        self[name] = module

    def module_for(self, scheme) -> Any:
        """The module of ``scheme`` (found by ``scheme.name``), imported if it was given as a path."""
        name = getattr(scheme, "name", None)
        target = self.get(name) if isinstance(name, str) else None
        if target is None:
            raise ValueError(
                f"spec.relative: expected a scheme {self.owner} implements (one of {sorted(self)}; add one with "
                f"{self.owner}.schemes.register_module(name, module)), got {name!r} ({type(scheme).__name__})"
            )
        return importlib.import_module(target) if isinstance(target, str) else target


def _module_name(module) -> str:
    return module if isinstance(module, str) else getattr(module, "__name__", repr(module))
