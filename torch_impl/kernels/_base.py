"""What a kernel is (KERN-1): a frozen description of *how* to compute, that says what it cannot compute."""

from __future__ import annotations

from typing import ClassVar, Optional

from spec import HOOKS, AttentionSpec

from .. import _core, schemes


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

    def automatic(self, spec: AttentionSpec, call) -> Optional[str]:
        """None when the automatic choice (``implementation=None``) may take this kernel for ``call``, else the
        reason: ``unsupported`` unless the kernel says more (KERN-1)."""
        return self.unsupported(spec, call)

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


def transform_qk(spec: AttentionSpec, params: dict, q, k, call):
    """REL-3 (1): the scheme's q/k transform (RoPE), once per call, after the head split, before any logit.

    q (B, H, Lq, d), k (B, Hkv, Lk, d) -> the same shapes; q and k themselves
    when the scheme has no such hook. The hook gets the positions as
    (1|B, L) int64, the defaults filled in (POS-1); default positions of a
    self-attention call are one tensor, so the hook may build one table.
    """
    scheme = spec.relative
    if scheme is None or "qk_transform" not in scheme.hooks:
        return q, k
    Lq, Lk = q.shape[2], k.shape[2]
    q_pos = _core.positions(call.q_positions, Lq, q.device)
    shared = call.default_positions and Lq == Lk
    k_pos = q_pos if shared else _core.positions(call.k_positions, Lk, k.device)
    return schemes.module_for(scheme).qk_transform(scheme, params, q, k, q_pos, k_pos)


def scheme_bias(spec: AttentionSpec, params: dict, call, stat):
    """REL-3 (3): the scheme's bias (ALiBi, T5, Swin) of the whole call, (1|B, H, Lq, Lk) in ``stat``
    (PREC-4), to add unscaled after the soft cap and before the ``bias`` input (SCALE-4); None when the
    scheme has no such hook. The eager and sdpa kernels call it once per call (the tiles kernel asks the
    scheme's ``tile_bias`` per tile instead).
    """
    scheme = spec.relative
    if scheme is None or "bias" not in scheme.hooks:
        return None
    per_distance = scheme_distance_bias(spec, params, call, stat)
    if per_distance is not None:  # a bias of j - i alone: computed once per distance, then laid out
        return by_distance(per_distance, call.Lq, call.Lk)
    return schemes.module_for(scheme).bias(scheme, params, call, num_heads=spec.num_heads, stat=stat)


def scheme_distance_bias(spec: AttentionSpec, params: dict, call, stat):
    """REL-3 (3) at default positions for a scheme whose bias depends on delta alone: its
    ``distance_bias``, (1, H, Lq + Lk - 1) in ``stat``, the value of every distance -(Lq - 1) .. Lk - 1;
    None for any other call or scheme."""
    scheme = spec.relative
    if scheme is None or "bias" not in scheme.hooks or not call.default_positions:
        return None
    hook = getattr(schemes.module_for(scheme), "distance_bias", None)
    return None if hook is None else hook(scheme, params, call, num_heads=spec.num_heads, stat=stat)


def scheme_reversed_bias(spec: AttentionSpec, params: dict, call, stat, workspace=None):
    """REL-3 (3) with the query rows in reverse order, (1, H, Lq, Lk) (row t: query Lq - 1 - t), for a
    kernel that runs the queries reversed: a strided view of ``distance_bias`` (ALiBi, T5: nothing
    written) or the scheme's ``reversed_bias`` (Swin's one window: one straight copy, into ``workspace``
    when given); None for any other call or scheme."""
    per_distance = scheme_distance_bias(spec, params, call, stat)
    if per_distance is not None:
        return per_distance.unfold(-1, call.Lk, 1)
    scheme = spec.relative
    hook = (
        None
        if scheme is None or "bias" not in scheme.hooks
        else getattr(schemes.module_for(scheme), "reversed_bias", None)
    )
    if hook is None:
        return None
    return hook(scheme, params, call, num_heads=spec.num_heads, stat=stat, workspace=workspace)


def by_distance(values, Lq: int, Lk: int):
    """(..., Lq + Lk - 1) values of the distances -(Lq - 1) .. Lk - 1 -> (..., Lq, Lk), entry [i, j] the
    value of distance j - i (POS-3): one strided copy instead of a term computed per pair. The eager kernel
    lays out a scheme's bias of the distance alone (REL-3 (3): ALiBi, T5) through it.

    ``unfold`` gives [t, j] = values[t + j], the distance t + j - (Lq - 1); row t is query Lq - 1 - t, hence
    the flip (sdpa hands SDPA the unflipped view and reverses the queries instead). Autograd sums every
    pair's gradient into its distance, then into the table rows.
    """
    return values.unfold(-1, Lk, 1).flip(-2)
