"""``train_in_eval_mode`` and ``eval_in_train_mode``: forwards whose modules are in the wrong mode.

Mode-dependent modules (:func:`mode_dependent`) behave differently in train and eval mode: dropout drops
units only in train mode; BatchNorm (and InstanceNorm that tracks running statistics) normalises with the
batch's statistics and updates its running ones in train mode, with the running ones in eval mode. A
forward pre-hook on the model reads their ``training`` flags (host booleans, no tensor op):

- ``train_in_eval_mode``: the last forward with autograd on before an optimizer step ran the model in
  eval mode with mode-dependent modules that train (``model.eval()`` for a validation pass and no
  ``model.train()`` after it). Reported when the model itself is in eval mode, or when a dropout that
  trains is; not for modules frozen on purpose (a frozen backbone in eval: the module's parameters, or
  those of the block that holds it, all have ``requires_grad=False``), nor for BatchNorm layers put in
  eval mode on purpose inside a model that trains (fine-tuning with small batches keeps their statistics).
- ``eval_in_train_mode``: forwards under ``torch.no_grad()`` / inference mode with dropout active or
  BatchNorm in train mode (updating its running statistics with the evaluation data). Reported for such a
  forward inside a validation phase the loop announces (:meth:`ModeCheck.begin_valid`), or for at least
  two of them in a row with no optimizer step and no forward with autograd between them: an evaluation
  loop. One no-grad forward per step — a GAN's ``with torch.no_grad(): fake = G(z)``, a teacher's or an
  EMA model's forward, pseudo-labels — is not evaluation and stays silent. Dropout kept on at evaluation
  on purpose (Monte-Carlo dropout) looks the same and is reported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookscope.doctor.findings import Finding

DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
# Consecutive no-grad forwards with modules in train mode that make an evaluation loop.
EVAL_FORWARDS = 2
NAMES_SHOWN = 3


def mode_dependent(module: nn.Module) -> bool:
    """Whether ``module``'s output depends on its ``training`` flag: dropout with p > 0, BatchNorm and
    InstanceNorm that track running statistics, RNNs and attention with dropout."""
    if isinstance(module, DROPOUTS):
        return module.p > 0
    if isinstance(module, (*BATCH_NORMS, *INSTANCE_NORMS)):
        return bool(module.track_running_stats)
    if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
        return module.dropout > 0
    return False


class ModeCheck:
    """The two mode kinds (see the module): fed by a forward pre-hook on the model and the loop's calls."""

    def __init__(self) -> None:
        self._root: nn.Module | None = None
        self._modules: list[tuple[str, nn.Module]] = []
        self._blocks: dict[str, nn.Module] = {}
        self._step = 0
        self._in_valid = False
        self._eval_at_step: list[int] = []  # indices of modules in eval mode in the last grad forward
        self._root_eval = False
        self._no_grad_run = 0  # consecutive no-grad forwards with modules in train mode
        self.train_in_eval: tuple[int, list[str], bool] | None = None  # step, modules, model in eval
        self.eval_in_train: tuple[int, list[str]] | None = None  # step, modules
        self._eval_forwards = 0
        # offenders per (modules in eval, model in eval): a frozen backbone in eval is the same every
        # step; forgotten at each check, so a backbone unfrozen later is seen
        self._verdicts: dict[tuple[tuple[int, ...], bool], list[str]] = {}

    def attach(self, model: nn.Module) -> None:
        self._root = model
        self._modules = [(name, m) for name, m in model.named_modules() if mode_dependent(m)]
        self._blocks = dict(model.named_modules())

    def begin_batch(self, step: int, training: bool) -> None:
        if training:
            self._step = step

    def begin_valid(self) -> None:
        self._in_valid = True

    def end_valid(self, step: int) -> None:
        self._in_valid = False

    def forward(self, root: nn.Module) -> None:
        """The model is about to run: read its modules' flags."""
        if torch.is_grad_enabled():
            self._root_eval = not root.training
            self._eval_at_step = [i for i, (_, m) in enumerate(self._modules) if not m.training]
            self._no_grad_run = 0
            return
        active = [i for i, (_, m) in enumerate(self._modules) if m.training]
        if not active:
            self._no_grad_run = 0
            return
        self._no_grad_run += 1
        if self._in_valid or self._no_grad_run >= EVAL_FORWARDS:
            self._eval_forwards += 1
            if self.eval_in_train is None:
                self.eval_in_train = (self._step, [self._modules[i][0] for i in active])

    def step_done(self) -> None:
        """An optimizer step applied what the last grad forward computed: was it in eval mode?"""
        self._no_grad_run = 0
        if self.train_in_eval is None and self._eval_at_step:
            key = (tuple(self._eval_at_step), self._root_eval)
            if key not in self._verdicts:
                self._verdicts[key] = self._offenders(self._eval_at_step)
            offenders = self._verdicts[key]
            if offenders:
                self.train_in_eval = (self._step, offenders, self._root_eval)
        self._eval_at_step = []

    def findings(self) -> list[Finding]:
        self._verdicts = {}
        return [*self._train_in_eval(), *self._eval_in_train()]

    def state_dict(self) -> dict[str, Any]:
        return {
            "train_in_eval": list(self.train_in_eval) if self.train_in_eval else None,
            "eval_in_train": list(self.eval_in_train) if self.eval_in_train else None,
            "eval_forwards": self._eval_forwards,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        train, evaluation = state["train_in_eval"], state["eval_in_train"]
        self.train_in_eval = (int(train[0]), list(train[1]), bool(train[2])) if train else None
        self.eval_in_train = (int(evaluation[0]), list(evaluation[1])) if evaluation else None
        self._eval_forwards = int(state["eval_forwards"])

    def _offenders(self, in_eval: list[int]) -> list[str]:
        """The modules in eval mode that matter: not frozen, and — unless the whole model is in eval
        mode — only when a dropout is among them (BatchNorm alone in eval is a known fine-tuning choice)."""
        names = [self._modules[i][0] for i in in_eval if not self._frozen(*self._modules[i])]
        if self._root_eval:
            return names
        dropout = any(isinstance(self._blocks[name], DROPOUTS) for name in names)
        return names if dropout else []

    def _frozen(self, name: str, module: nn.Module) -> bool:
        """Frozen on purpose: the module's own parameters, or (a module without any, like dropout) those
        of the nearest block holding it that has some, all have ``requires_grad=False``."""
        while True:
            params = list(module.parameters())
            if params:
                return not any(p.requires_grad for p in params)
            name = name.rpartition(".")[0]
            module = self._blocks.get(name)
            if not name or module is None or module is self._root:
                return False

    def _train_in_eval(self) -> list[Finding]:
        if self.train_in_eval is None:
            return []
        step, names, model_eval = self.train_in_eval
        where = "the model was in eval mode" if model_eval else "dropout layers were in eval mode"
        message = (
            f"optimizer step {step} trained on a forward in which {where}: {_listed(names)} — dropout "
            "drops nothing and BatchNorm normalises with frozen running statistics, so the model trains "
            "as it is evaluated. Typically `model.eval()` for a validation pass and no `model.train()` "
            "after it: call `model.train()` before each training epoch (after validation)."
        )
        evidence = {"modules": names, "model_in_eval": model_eval}
        module = "" if model_eval else names[0]
        return [Finding("train_in_eval_mode", module, step, "error", message, evidence)]

    def _eval_in_train(self) -> list[Finding]:
        if self.eval_in_train is None:
            return []
        step, names = self.eval_in_train
        message = (
            f"{self._eval_forwards} forward(s) under `torch.no_grad()` (an evaluation or prediction, at "
            f"step {step}) ran with modules in train mode: {_listed(names)} — dropout drops units at "
            "random and BatchNorm uses the batch's statistics and overwrites its running statistics with "
            "the evaluation data. Call `model.eval()` before evaluating and `model.train()` after."
        )
        evidence = {"modules": names, "forwards": self._eval_forwards}
        return [Finding("eval_in_train_mode", "", step, "warning", message, evidence)]


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"`{name}`" for name in names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown
