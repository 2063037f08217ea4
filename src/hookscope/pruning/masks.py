"""prune(), sparsity(), finalize_pruning(): masks on ``torch.nn.utils.prune``, chosen by any importance.

A pruned module keeps ``weight_orig`` (the parameter the optimizer trains) and the buffer ``weight_mask``;
a forward pre-hook makes ``weight = weight_orig * weight_mask``, so pruned weights are exactly zero and
no gradient reaches them through the mask, and training goes on with the masks in place. ``amount`` is
the sparsity the layer (or, with ``scope="global"``, the selection) has *after* the call, counting what
was already pruned: a weight once pruned stays pruned, so calling ``prune`` with rising amounts is
gradual pruning. ``finalize_pruning`` folds the masks into plain weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from hookscope._deprecation import renamed_keywords
from hookscope.hooks.select import Spec
from hookscope.hooks.select import select as select_modules
from hookscope.pruning.importance import Batch, importance, weighted_modules

SCOPES = ("layer", "global")


@dataclass(frozen=True)
class SparsityRow:
    """One module's tensor ``param``: ``zeros`` of ``numel`` are pruned (masked; exactly zero when it carries
    no mask, ``masked=False``); ``channels_pruned`` of ``channels`` slices along dim 0 are entirely so."""

    name: str
    param: str
    numel: int
    zeros: int
    channels: int
    channels_pruned: int
    masked: bool

    @property
    def sparsity(self) -> float:
        """Fraction of the tensor that is exactly zero."""
        return self.zeros / self.numel if self.numel else 0.0


@dataclass
class Sparsity:
    """Per-layer sparsity table (``rows``), the global fraction over them (``total``), printable."""

    rows: list[SparsityRow] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Zeros over elements, summed across every row: the global sparsity of the selection."""
        numel = sum(r.numel for r in self.rows)
        return sum(r.zeros for r in self.rows) / numel if numel else 0.0

    def __getitem__(self, name: str) -> float:
        """The sparsity of module ``name``'s weight."""
        for row in self.rows:
            if row.name == name and row.param == "weight":
                return row.sparsity
        raise KeyError(f"sparsity: no row for module {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (a run folder's ``pruning.json``)."""
        rows = [{**vars(r), "sparsity": r.sparsity} for r in self.rows]
        return {"total": self.total, "rows": rows}

    def __str__(self) -> str:
        header = f"{'layer':<28} {'param':<7} {'elements':>10} {'zeros':>10} {'sparsity':>9} {'channels':>11}"
        lines = [header, "-" * len(header)]
        for r in self.rows:
            channels = f"{r.channels_pruned}/{r.channels}"
            lines.append(
                f"{r.name:<28} {r.param:<7} {r.numel:>10,} {r.zeros:>10,} {r.sparsity:>9.1%} {channels:>11}"
            )
        lines.append(
            f"{'total':<28} {'':<7} {sum(r.numel for r in self.rows):>10,} "
            f"{sum(r.zeros for r in self.rows):>10,} {self.total:>9.1%}"
        )
        return "\n".join(lines)


@renamed_keywords(spec="select")
def prune(
    model: nn.Module,
    select: Spec,
    amount: float,
    how: str = "l1",
    *,
    structured: bool = False,
    dim: int = 0,
    scope: str = "layer",
    data: Iterable[Batch] | None = None,
    loss_func: Callable[..., torch.Tensor] | None = None,
    name: str = "weight",
) -> Sparsity:
    """Mask the lowest-scoring ``amount`` of the weights of the modules ``select`` selects; returns
    :func:`sparsity` of those modules.

    ``how``: ``"l1"`` (magnitude), ``"random"``, ``"activation"`` or ``"taylor"`` (measured through hooks
    over ``data``; ``taylor`` needs ``loss_func``), see :mod:`hookscope.pruning.importance`.
    ``structured=True`` masks whole slices along ``dim`` (``dim=0``: output channels, whose bias entries
    are masked with them, so a pruned channel outputs exactly zero). ``scope="global"`` spreads ``amount``
    over the whole selection (structured scores are divided by their layer's mean first, so layers of
    different scale compete fairly).
    """
    _check_amount(amount, scope)
    modules = weighted_modules(model, select, name)
    scores = importance(
        model, select, how, structured=structured, dim=dim, data=data, loss_func=loss_func, name=name
    )
    masks = _choose(modules, scores, amount, structured, dim, scope, name)
    for module_name, module in modules:
        set_mask(module, name, masks[module_name])
        if structured and dim == 0 and isinstance(getattr(module, "bias", None), torch.Tensor):
            set_mask(module, "bias", masks[module_name].reshape(masks[module_name].shape[0], -1)[:, 0])
    return sparsity(model, [n for n, _ in modules])


@renamed_keywords(spec="select")
def sparsity(model: nn.Module, select: Spec = None) -> Sparsity:
    """Per-layer table of pruned weights (and masked biases) of the selected modules.

    ``select=None`` (the default) lists every module holding a ``weight`` tensor. A masked tensor counts the
    zeros of its mask; an unmasked one the weights that are exactly zero.
    """
    selected = [
        (n, m)
        for n, m in select_modules(model, select)
        if isinstance(getattr(m, "weight", None), torch.Tensor)
    ]
    rows = []
    for module_name, module in selected:
        rows.append(_row(module_name, module, "weight"))
        if is_masked(module, "bias"):
            rows.append(_row(module_name, module, "bias"))
    return Sparsity(rows)


def finalize_pruning(model: nn.Module) -> int:
    """Make every mask permanent: ``weight`` becomes a plain parameter holding the zeros, the mask and its
    hook go. Returns how many tensors were finalized. Do this before exporting, or before :func:`compact`."""
    done = 0
    for module in model.modules():
        for tensor_name in masked_names(module):
            torch_prune.remove(module, tensor_name)
            done += 1
    return done


def set_mask(module: nn.Module, name: str, mask: torch.Tensor) -> None:
    """Give ``module.<name>`` the mask ``mask`` (1 keeps, 0 prunes), replacing any mask it already has."""
    mask = mask.to(device=getattr(module, name).device, dtype=getattr(module, name).dtype)
    if not is_masked(module, name):
        torch_prune.custom_from_mask(module, name, mask)
        return
    getattr(module, f"{name}_mask").copy_(mask)
    _recompute(module, name)  # the pre-hook would only at the next forward; readers may look before


def refresh_masked(model: nn.Module) -> None:
    """Recompute every masked tensor from its ``_orig`` parameter (after those were overwritten)."""
    for module in model.modules():
        for tensor_name in masked_names(module):
            _recompute(module, tensor_name)


def _recompute(module: nn.Module, name: str) -> None:
    """``module.<name> = <name>_orig * <name>_mask``, what the pruning pre-hook does at each forward."""
    setattr(module, name, getattr(module, f"{name}_orig") * getattr(module, f"{name}_mask"))


def is_masked(module: nn.Module, name: str) -> bool:
    """``module.<name>`` carries a pruning mask (``<name>_orig`` and ``<name>_mask``)."""
    return hasattr(module, f"{name}_orig") and hasattr(module, f"{name}_mask")


def masked_names(module: nn.Module) -> list[str]:
    """The tensor names of ``module`` that carry a pruning mask (``["weight", "bias"]``, ...)."""
    return [
        n.removesuffix("_orig")
        for n, _ in module.named_parameters(recurse=False)
        if n.endswith("_orig") and is_masked(module, n.removesuffix("_orig"))
    ]


def masks_to_restore(model: nn.Module, state: Mapping[str, Any]) -> list[str]:
    """Qualified names (``"features.0.weight"``) that ``state`` holds pruned (``<name>_orig`` and
    ``<name>_mask``) while ``model`` holds them as plain parameters: a pruned model's checkpoint loaded
    into a fresh, unpruned copy of it."""
    plain = dict(model.named_parameters())
    return [
        key.removesuffix("_orig")
        for key in state
        if key.endswith("_orig")
        and key.removesuffix("_orig") in plain
        and f"{key.removesuffix('_orig')}_mask" in state
    ]


def restore_masks(model: nn.Module, names: Iterable[str]) -> None:
    """Put a (keep-everything) mask on each qualified tensor name, so that loading a pruned model's
    ``state_dict`` fills ``_orig`` and ``_mask`` as saved (the masked tensors are recomputed after that
    load). The parameter object is kept (as ``_orig``), so an optimizer built on the model still updates
    it."""
    names = list(names)
    for qualified in names:
        module_name, _, tensor_name = qualified.rpartition(".")
        torch_prune.identity(model.get_submodule(module_name), tensor_name)
    if names:
        _refresh_after_next_load(model)


def _refresh_after_next_load(model: nn.Module) -> None:
    """Recompute the masked tensors once the coming ``load_state_dict`` filled ``_orig`` and ``_mask``:
    until then they hold the old weights (the pruning pre-hook refreshes them only at a forward)."""

    def refresh(module: nn.Module, incompatible: Any) -> None:
        handle.remove()
        refresh_masked(module)

    handle = model.register_load_state_dict_post_hook(refresh)


def _row(module_name: str, module: nn.Module, param: str) -> SparsityRow:
    # a masked tensor counts what its mask prunes: a weight that merely is zero (a fresh BatchNorm's bias)
    # was not pruned
    masked = is_masked(module, param)
    tensor = getattr(module, f"{param}_mask" if masked else param).detach()
    zero = (tensor == 0).reshape(tensor.shape[0], -1) if tensor.dim() else (tensor == 0).reshape(1, 1)
    return SparsityRow(
        name=module_name,
        param=param,
        numel=tensor.numel(),
        zeros=int(zero.sum()),
        channels=zero.shape[0],
        channels_pruned=int(zero.all(1).sum()),
        masked=masked,
    )


def _check_amount(amount: float, scope: str) -> None:
    if not isinstance(amount, int | float) or not 0.0 <= amount <= 1.0:
        raise ValueError(f"prune: amount={amount!r} must be a fraction between 0 and 1 (0.5 = half pruned)")
    if scope not in SCOPES:
        raise ValueError(f"prune: scope={scope!r}; use 'layer' (amount per layer) or 'global' (over all)")


def _choose(
    modules: list[tuple[str, nn.Module]],
    scores: dict[str, torch.Tensor],
    amount: float,
    structured: bool,
    dim: int,
    scope: str,
    name: str,
) -> dict[str, torch.Tensor]:
    """The new mask of each module (shaped like its weight): the lowest scores pruned, old prunes kept."""
    kept = {n: _kept_units(m, name, structured, dim) for n, m in modules}
    ranked = {n: torch.where(kept[n], scores[n].float(), -torch.inf) for n, _ in modules}
    if scope == "global":
        unit_masks = _global_masks(ranked, amount, normalise=structured)
    else:
        unit_masks = {n: _lowest_pruned(r, round(amount * r.numel())) for n, r in ranked.items()}
    return {n: _expand(unit_masks[n], getattr(m, name), structured, dim) for n, m in modules}


def _kept_units(module: nn.Module, name: str, structured: bool, dim: int) -> torch.Tensor:
    """Which weights (or slices along ``dim``) the current mask keeps: a pruned one stays pruned."""
    if not is_masked(module, name):
        weight = getattr(module, name)
        shape = (weight.shape[dim],) if structured else weight.shape
        return torch.ones(shape, dtype=torch.bool, device=weight.device)
    mask = getattr(module, f"{name}_mask") != 0
    if not structured:
        return mask
    return mask.transpose(0, dim).reshape(mask.shape[dim], -1).any(1)


def _lowest_pruned(scores: torch.Tensor, n_pruned: int) -> torch.Tensor:
    """A mask of ``scores``' shape with its ``n_pruned`` lowest entries 0 (stable: ties go to the first)."""
    flat = scores.flatten()
    order = torch.argsort(flat, stable=True)
    mask = torch.ones_like(flat)
    mask[order[:n_pruned]] = 0
    return mask.reshape(scores.shape)


def _global_masks(ranked: dict[str, torch.Tensor], amount: float, normalise: bool) -> dict[str, torch.Tensor]:
    if normalise:
        ranked = {n: r / _mean_finite(r) for n, r in ranked.items()}
    flat = torch.cat([r.flatten() for r in ranked.values()])
    mask = _lowest_pruned(flat, round(amount * flat.numel()))
    masks, start = {}, 0
    for n, r in ranked.items():
        masks[n] = mask[start : start + r.numel()].reshape(r.shape)
        start += r.numel()
    return masks


def _mean_finite(scores: torch.Tensor) -> torch.Tensor:
    finite = scores[torch.isfinite(scores)]
    mean = finite.mean() if finite.numel() else torch.tensor(1.0)
    return mean if mean > 0 else torch.tensor(1.0)


def _expand(unit_mask: torch.Tensor, weight: torch.Tensor, structured: bool, dim: int) -> torch.Tensor:
    if not structured:
        return unit_mask
    shape = [1] * weight.dim()
    shape[dim] = -1
    return unit_mask.reshape(shape).expand_as(weight).clone()
