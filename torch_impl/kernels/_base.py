"""What a kernel is (KERN-1): a frozen description of *how* to compute, that says what it cannot compute."""

from __future__ import annotations

from typing import ClassVar, Optional

from spec import HOOKS, AttentionSpec


class Kernel:
    """The base of the kernels: a frozen dataclass per kernel, its tuning knobs as fields (KERN-1).

    Class attributes:
      name: the kernel's name for ``implementation=`` (``"tiles"``).
      scheme_hooks: the hook kinds (``spec.HOOKS``) it has a call site for.
    """

    name: ClassVar[str] = ""
    scheme_hooks: ClassVar[frozenset] = frozenset()

    def unsupported(self, spec: AttentionSpec, call) -> Optional[str]:
        """None when this kernel computes ``call`` (a ``_core.Call``) under ``spec``, else the reason (KERN-1).

        The automatic choice asks the same question (``kernels.resolve``).
        """
        return self.missing_hooks(spec)

    def missing_hooks(self, spec: AttentionSpec) -> Optional[str]:
        """The reason, when spec.relative uses a hook kind this kernel never calls (REL-3)."""
        scheme = spec.relative
        if scheme is None:
            return None
        used = scheme.hooks
        if used <= self.scheme_hooks:
            return None
        missing = [h for h in HOOKS if h in used and h not in self.scheme_hooks]
        calls = ", ".join(h for h in HOOKS if h in self.scheme_hooks) or "no hook: it takes no relative scheme"
        return (
            f"{type(scheme).__name__} relative terms need the {' and '.join(missing)} hook"
            f"{'s' if len(missing) > 1 else ''}, and {self.name} calls {calls}"
        )
