"""Position schemes as units (rules REL-1, REL-3, REL-4).

A scheme says *what* a relative position encoding adds to attention, through
at most four hooks (HOOKS): a transform of q and k (RoPE), a
query-dependent key term (Shaw keys, Huang), a query-independent bias
(ALiBi, T5, Swin) and a value term (Shaw values). *How* it is computed is
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
from typing import ClassVar

__all__ = ["HOOKS", "Scheme", "register", "unregister", "scheme_classes", "scheme_from_json"]

#: The hook kinds, in the order the core applies them (REL-3).
HOOKS = ("qk_transform", "key_term", "bias", "value_term")

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

    def param_shapes(self, num_heads: int, head_dim: int) -> dict[str, tuple[int, ...]]:
        """The canonical tables this scheme adds (PARAM-1), name -> shape, in canonical order."""
        raise NotImplementedError

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
