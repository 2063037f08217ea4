"""Pruning: gradual pruning during training, on the cubic schedule of Zhu & Gupta (2017), with an optional
lottery-ticket rewind.

The sparsity target rises from ``initial_sparsity`` at ``start_step`` to ``final_sparsity`` at
``end_step`` as ``s_t = s_f + (s_i - s_f) (1 - (t - t0) / (t_end - t0))^3``: fast at first, while many
weights are redundant, then slowly. Every ``every`` optimizer steps in that span (and at ``end_step``)
:func:`hookscope.prune` raises the masks to ``s_t``, scoring with any ``how``; ``activation`` and ``taylor``
are measured through hooks on the batch about to be trained. The masks live in the model
(``weight_orig`` / ``weight_mask``), so a checkpoint keeps them and a resumed fit continues bitwise; a
pruned checkpoint loaded into a fresh, unpruned model gets its masks back (see
``train/checkpoint/weights.py``).

``rewind_step=k`` keeps a copy of every parameter at step ``k`` and, right after the last pruning step,
resets the surviving weights (and every other parameter) to it: the lottery-ticket procedure with
rewinding (Frankle et al. 2019). The optimizer's state is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hookscope._deprecation import renamed_keywords
from hookscope.hooks.select import Spec
from hookscope.pruning.masks import prune, refresh_masked, sparsity
from hookscope.train.callback import Callback


def cubic_sparsity(step: int, initial: float, final: float, start: int, end: int) -> float:
    """Zhu & Gupta's target at ``step``: ``initial`` before ``start``, ``final`` from ``end`` on."""
    if step <= start:
        return initial
    if step >= end:
        return final
    return final + (initial - final) * (1 - (step - start) / (end - start)) ** 3


class Pruning(Callback):
    """Prune the modules ``select`` selects from ``initial_sparsity`` to ``final_sparsity`` between
    ``start_step`` and ``end_step`` (optimizer steps; ``None``: two thirds into the fit, leaving the rest
    to recover), every ``every`` steps.

    ``how``, ``structured``, ``dim`` and ``scope`` are those of :func:`hookscope.prune`; ``loss_func`` for
    ``how="taylor"`` defaults to the Learner's. ``rewind_step``: see the module docstring. After the fit,
    :attr:`log` holds ``(step, target, reached)`` for every pruning step and :meth:`table` the sparsity.
    """

    run_valid = False

    @renamed_keywords(spec="select")
    def __init__(
        self,
        select: Spec,
        final_sparsity: float,
        initial_sparsity: float = 0.0,
        start_step: int = 0,
        end_step: int | None = None,
        every: int = 10,
        how: str = "l1",
        structured: bool = False,
        dim: int = 0,
        scope: str = "layer",
        loss_func: Callable[..., torch.Tensor] | None = None,
        rewind_step: int | None = None,
    ) -> None:
        if not 0.0 <= initial_sparsity <= final_sparsity <= 1.0:
            raise ValueError(
                f"Pruning: need 0 <= initial_sparsity ({initial_sparsity}) <= final_sparsity "
                f"({final_sparsity}) <= 1"
            )
        if every < 1 or start_step < 0:
            raise ValueError(f"Pruning: every={every} must be >= 1 and start_step={start_step} >= 0")
        if end_step is not None and end_step <= start_step:
            raise ValueError(f"Pruning: end_step={end_step} must come after start_step={start_step}")
        if rewind_step is not None and not 0 <= rewind_step <= (
            end_step if end_step is not None else rewind_step
        ):
            raise ValueError(f"Pruning: rewind_step={rewind_step} must lie between 0 and end_step={end_step}")
        self.select, self.how, self.structured, self.dim, self.scope = select, how, structured, dim, scope
        self.initial, self.final = initial_sparsity, final_sparsity
        self.start_step, self.end_step, self.every = start_step, end_step, every
        self.loss_func, self.rewind_step = loss_func, rewind_step
        self.log: list[tuple[int, float, float]] = []
        self._last_pruned = -1
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._rewound = False

    @property
    def end(self) -> int:
        """The step at which ``final_sparsity`` is reached."""
        if self.end_step is not None:
            return self.end_step
        total = self.learn.n_epoch * len(self.learn.dls.train)
        return max(self.start_step + 1, (2 * total) // 3)

    def before_batch(self) -> None:
        step = self.learn.training_step
        if step == self.rewind_step and self._snapshot is None and not self._rewound:
            self._snapshot = {_plain(n): p.detach().clone() for n, p in self.learn.model.named_parameters()}
        if step == self._last_pruned or not self._due(step):
            return
        self._last_pruned = step
        target = cubic_sparsity(step, self.initial, self.final, self.start_step, self.end)
        table = prune(
            self.learn.model,
            self.select,
            target,
            self.how,
            structured=self.structured,
            dim=self.dim,
            scope=self.scope,
            data=[(*self.learn.xb, *self.learn.yb)],
            loss_func=self.loss_func or self.learn.loss_func,
        )
        self.log.append((step, target, table.total))
        if step >= self.end and self._snapshot is not None:
            self._rewind()

    def table(self) -> Any:
        """:func:`hookscope.sparsity` of the pruned modules now."""
        return sparsity(self.learn.model, self.select)

    def record(self) -> dict[str, Any]:
        """What the run folder keeps (``pruning.json``): settings, the schedule followed, the final table."""
        return {
            "how": self.how,
            "structured": self.structured,
            "scope": self.scope,
            "initial_sparsity": self.initial,
            "final_sparsity": self.final,
            "start_step": self.start_step,
            "end_step": self.end,
            "every": self.every,
            "rewind_step": self.rewind_step,
            "log": [list(entry) for entry in self.log],
            "sparsity": self.table().to_dict(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "log": [list(entry) for entry in self.log],
            "last_pruned": self._last_pruned,
            "snapshot": self._snapshot,
            "rewound": self._rewound,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.log = [tuple(entry) for entry in state["log"]]
        self._last_pruned = state["last_pruned"]
        self._snapshot = state["snapshot"]
        self._rewound = state["rewound"]

    def _due(self, step: int) -> bool:
        if step < self.start_step or step > self.end:
            return False
        return (step - self.start_step) % self.every == 0 or step == self.end

    def _rewind(self) -> None:
        """Reset every parameter (``weight_orig`` of pruned layers included) to its value at rewind_step."""
        with torch.no_grad():
            for name, param in self.learn.model.named_parameters():
                param.copy_(self._snapshot[_plain(name)])
        refresh_masked(self.learn.model)
        self._snapshot, self._rewound = None, True


def _plain(name: str) -> str:
    """A parameter's name as it was before pruning renamed it (``conv.weight_orig`` -> ``conv.weight``)."""
    return name.removesuffix("_orig")
