"""Recorder: per-epoch losses and metrics, per-step losses and learning rates — without a host sync per step.

Each step only keeps a reference to the (device) loss tensor and the batch size. The epoch's weighted means
and the metrics are reduced on the device and read back in one transfer at the end of the epoch; the
smoothed loss is computed when someone asks for it (the progress bar, at a bounded rate).

Under torchrun the epoch's losses and metrics are global: each rank's sample-weighted sums and sample
counts are added over ranks in one all-reduce per phase, then divided (stateful metrics such as
torchmetrics' sync themselves in ``compute``). Per-step ``losses`` and ``smooth_loss`` stay this rank's
(reducing them would cost a sync per step).

It lives beside the loop, not in the callback catalogue: the Learner adds one by default and
``Learner.validate`` returns what it measures, so the loop depends on it (and on nothing in ``callbacks/``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from hookscope.html_table import html_table
from hookscope.metrics import is_stateful, metric_name
from hookscope.train import distributed
from hookscope.train.callback import Callback

_CHUNK = 1024  # per-step losses are stacked into one tensor every _CHUNK steps to keep few objects alive


class History(list[dict[str, Any]]):
    """``learn.recorder.history``: one dict per epoch, a plain list that a notebook shows as a table (one
    row per epoch, one column per key; numbers to four decimals, ``time`` in seconds)."""

    def _repr_html_(self) -> str:
        if not self:
            return "<p>No epoch recorded yet.</p>"
        columns = list(dict.fromkeys(key for row in self for key in row))
        rows = [[_cell(row.get(key, "")) for key in columns] for row in self]
        numeric = [i for i, key in enumerate(columns) if any(_is_number(row.get(key)) for row in self)]
        return html_table(columns, rows, numeric=numeric)


def _cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Recorder(Callback):
    """Keeps ``history`` (one dict per epoch), ``losses`` / ``lrs`` per training step, and ``smooth_loss``.

    A history row is ``{"epoch", "train_loss", "valid_loss", <metric>..., <recorded>..., "time"}``; a
    value that was not measured (no validation data, a cancelled phase) is ``nan``. Callbacks add their own
    per-batch values (a GAN's discriminator loss, say) with :meth:`record`. The Recorder runs first at every
    event (``order=-20``) so other callbacks' ``after_epoch`` see the current epoch's row.

    At ``after_validate`` it writes the phase's loss and metrics (device tensors) to ``learn.valid_record``:
    what :meth:`Learner.validate <hookscope.train.learner.Learner.validate>` returns.
    """

    order = -20

    def __init__(self, beta: float = 0.98) -> None:
        self.beta = beta
        self._reset()
        self._keep_on_next_fit = False

    @property
    def name(self) -> str:
        """Always ``recorder``, also for subclasses: other callbacks find it as ``learn.recorder``."""
        return "recorder"

    # ---- reading -------------------------------------------------------------------------------------

    @property
    def losses(self) -> list[float]:
        """The loss of every training step so far (one transfer per call)."""
        return self._step_losses().tolist()

    @property
    def lrs(self) -> list[float]:
        """The learning rate of the first parameter group at every training step."""
        return [float(lr) for lr in self._lrs]

    @property
    def smooth_loss(self) -> float:
        """Exponential moving average of the training loss (debiased), ``nan`` before the first step."""
        self._fold_smoothing()
        if self._ema_count == 0:
            return math.nan
        return float(self._ema) / (1 - self.beta**self._ema_count)

    @property
    def metric_names(self) -> list[str]:
        """History keys of the learner's metrics, in order."""
        return [metric_name(m) for m in self.learn.metrics]

    def _repr_html_(self) -> str:
        """In a notebook, ``learn.recorder`` shows its history as a table."""
        return self.history._repr_html_()

    # ---- recording a callback's values ---------------------------------------------------------------

    def record(self, **values: torch.Tensor | float) -> None:
        """Record named values of the current batch beside its loss, e.g. ``record(D_loss=loss.detach())``.

        Each history row gets their batch-size weighted mean over the epoch's training batches as
        ``<name>`` (over validation batches as ``valid_<name>``; ``nan`` in an epoch that recorded none).
        Tensors stay on their device: they are read in the epoch's one transfer, never per batch.
        """
        learn = self.learn
        size = _batch_size(learn.yb[0] if learn.yb else learn.xb[0])
        for name, value in values.items():
            key = name if learn.training else f"valid_{name}"
            if key not in self._value_keys:
                self._value_keys.append(key)
            tensors, sizes = self._values.setdefault(key, ([], []))
            tensors.append(torch.as_tensor(value, device=learn.device).detach().float().mean())
            sizes.append(size)

    # ---- events --------------------------------------------------------------------------------------

    def before_fit(self) -> None:
        if len(set(self.metric_names)) != len(self.metric_names):
            raise ValueError(
                f"Recorder: metric names {self.metric_names} are not unique; give each metric a distinct "
                "`name` attribute or function name"
            )
        for metric in self.learn.metrics:
            if is_stateful(metric) and hasattr(metric, "to"):
                metric.to(self.learn.device)
        if not self._keep_on_next_fit:
            self._reset()
        self._keep_on_next_fit = False
        self._start_epoch()  # also ready when a callback running earlier cancels the first epoch

    def before_epoch(self) -> None:
        self._start_epoch()

    def before_train(self) -> None:
        losses, sizes = self._carried
        self._carried = ([], [])
        if self.learn.train_iter == 0:  # a fresh fit, not a resume in the middle of an epoch
            losses, sizes = [], []
        self._phase_losses = list(torch.tensor(losses, device=self.learn.device).unbind())
        self._phase_sizes = sizes
        carried, self._carried_values = self._carried_values, {}
        if self.learn.train_iter:  # resumed mid-epoch: the values recorded before the save count too
            self._values = {
                key: (list(torch.tensor(v["values"], device=self.learn.device).unbind()), list(v["sizes"]))
                for key, v in carried.items()
            }

    def before_validate(self) -> None:
        self._phase_losses, self._phase_sizes = [], []
        self._metric_values = [[] for _ in self.learn.metrics]
        for metric in self.learn.metrics:
            if is_stateful(metric):
                metric.reset()

    def after_batch(self) -> None:
        learn = self.learn
        loss = learn.loss
        if loss is None:
            return
        if loss.ndim:
            loss = loss.mean()
        size = _batch_size(learn.yb[0] if learn.yb else learn.xb[0])
        self._phase_losses.append(loss)
        self._phase_sizes.append(size)
        if learn.training:
            self._record_step(loss, learn.opt.param_groups[0]["lr"])
        else:
            self._measure_metrics(learn.pred, learn.yb)

    def after_train(self) -> None:
        self._train_loss = self._weighted_means([self._phase_losses], self._phase_sizes)[0]
        # emptied so that a phase cancelled before the Recorder sees it records nothing
        self._phase_losses, self._phase_sizes = [], []

    def after_validate(self) -> None:
        self._valid = self._unmeasured_valid()
        # Under torchrun every rank reduces (a rank with an empty shard too): a collective needs them all.
        if self._phase_sizes or distributed.is_distributed():
            plain = [(m, v) for m, v in zip(self.learn.metrics, self._metric_values, strict=True)]
            plain = [(m, v) for m, v in plain if not is_stateful(m)]
            means = self._weighted_means([self._phase_losses, *(v for _, v in plain)], self._phase_sizes)
            self._valid["valid_loss"] = means[0]
            self._valid.update({metric_name(m): mean for (m, _), mean in zip(plain, means[1:], strict=True)})
            for metric in self.learn.metrics:
                if is_stateful(metric):
                    self._valid[metric_name(metric)] = torch.as_tensor(metric.compute()).float().reshape(())
        self._phase_losses, self._phase_sizes = [], []
        self.learn.valid_record = dict(self._valid)

    def after_epoch(self) -> None:
        recorded = {key: self._weighted_mean(*self._values.get(key, ([], []))) for key in self._value_keys}
        names = ["train_loss", *self._valid, *recorded]
        device = self._valid["valid_loss"].device
        tensors = [self._train_loss, *self._valid.values(), *recorded.values()]
        values = torch.stack([t.to(device) for t in tensors]).tolist()
        row: dict[str, Any] = {"epoch": self.learn.epoch, **dict(zip(names, values, strict=True))}
        row["time"] = time.perf_counter() - self._epoch_start
        self.history.append(row)
        self._start_epoch()  # a next epoch cancelled before the Recorder sees it must not repeat this row

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Records so far, the moving average, and — saved mid-epoch — this epoch's training losses (under
        torchrun those of every rank, gathered: the checkpoint is saved by all ranks together)."""
        self._fold_smoothing()
        mid_train = getattr(self, "learn", None) is not None and self.learn.training
        losses = torch.stack(self._phase_losses).tolist() if mid_train and self._phase_losses else []
        sizes = list(self._phase_sizes) if mid_train else []
        ranks = distributed.all_gather((losses, sizes))
        losses, sizes = [x for r in ranks for x in r[0]], [n for r in ranks for n in r[1]]
        return {
            "history": [dict(row) for row in self.history],
            "losses": self.losses,
            "lrs": self.lrs,
            "smooth": {"ema": float(self._ema), "count": self._ema_count},
            "epoch_losses": losses,
            "epoch_sizes": sizes,
            "epoch_ranks": len(ranks),
            "value_keys": list(self._value_keys),
            "epoch_values": self._epoch_values() if mid_train else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the records; the next ``fit`` continues them instead of starting afresh (resume), and a
        resumed epoch's ``train_loss`` also counts the batches done before the save."""
        self._reset()
        self.history = History(dict(row) for row in state["history"])
        self._chunks = [torch.tensor(state["losses"], dtype=torch.float32)]
        self._lrs = list(state["lrs"])
        self._ema = torch.tensor(state["smooth"]["ema"])
        self._ema_count = state["smooth"]["count"]
        self._carried = _own_share(state)
        self._value_keys = list(state.get("value_keys", []))  # absent from checkpoints older than record()
        self._carried_values = dict(state.get("epoch_values", {}))
        if not distributed.is_rank_zero():  # as for the losses: rank 0 carries every rank's values
            self._carried_values = {}
        self._keep_on_next_fit = True

    # ---- helpers -------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self.history = History()
        self._chunks: list[torch.Tensor] = []
        self._pending: list[torch.Tensor] = []
        self._unsmoothed: list[torch.Tensor] = []
        self._lrs: list[Any] = []
        self._ema = torch.zeros(())
        self._ema_count = 0
        self._phase_losses: list[torch.Tensor] = []
        self._phase_sizes: list[int] = []
        self._metric_values: list[list[torch.Tensor]] = []
        self._valid: dict[str, torch.Tensor] = {}
        self._carried: tuple[list[float], list[int]] = ([], [])  # a resumed epoch's batches before the save
        self._value_keys: list[str] = []  # names given to record(), in order of first use
        self._values: dict[str, tuple[list[torch.Tensor], list[int]]] = {}  # this epoch's, per name
        self._carried_values: dict[str, Any] = {}  # a resumed epoch's recorded values before the save

    def _epoch_values(self) -> dict[str, dict[str, list[Any]]]:
        """This epoch's :meth:`record`-ed values so far, per name (every rank's, gathered, under torchrun)."""
        mine = {
            key: {"values": torch.stack(tensors).tolist(), "sizes": list(sizes)}
            for key, (tensors, sizes) in self._values.items()
        }
        merged: dict[str, dict[str, list[Any]]] = {}
        for rank_values in distributed.all_gather(mine):
            for key, entry in rank_values.items():
                into = merged.setdefault(key, {"values": [], "sizes": []})
                into["values"] += entry["values"]
                into["sizes"] += entry["sizes"]
        return merged

    def _start_epoch(self) -> None:
        self._epoch_start = time.perf_counter()
        self._values = {}
        self._train_loss = torch.tensor(math.nan)
        self._valid = self._unmeasured_valid()

    def _record_step(self, loss: torch.Tensor, lr: Any) -> None:
        self._pending.append(loss)
        self._unsmoothed.append(loss)
        self._lrs.append(lr)
        if len(self._pending) >= _CHUNK:
            self._chunks.append(torch.stack(self._pending).float().detach())
            self._pending = []
        if len(self._unsmoothed) >= _CHUNK:
            self._fold_smoothing()

    def _fold_smoothing(self) -> None:
        """Fold the losses not yet averaged into the moving average, on their device (no sync)."""
        if not self._unsmoothed:
            return
        new = torch.stack(self._unsmoothed).float()
        powers = torch.arange(len(new) - 1, -1, -1, device=new.device, dtype=torch.float32)
        weighted = ((1 - self.beta) * self.beta**powers * new).sum()
        self._ema = self._ema.to(new.device) * self.beta ** len(new) + weighted
        self._ema_count += len(new)
        self._unsmoothed = []

    def _step_losses(self) -> torch.Tensor:
        """All step losses in one tensor on the device of the newest ones (so one transfer reads them)."""
        parts = [*self._chunks, torch.stack(self._pending).float()] if self._pending else list(self._chunks)
        if not parts:
            return torch.zeros(0)
        return torch.cat([p.to(parts[-1].device) for p in parts])

    def _measure_metrics(self, pred: torch.Tensor, yb: tuple) -> None:
        for metric, values in zip(self.learn.metrics, self._metric_values, strict=True):
            if is_stateful(metric):
                metric.update(pred, *yb)
            else:
                values.append(torch.as_tensor(metric(pred, *yb), device=pred.device).reshape(()))

    def _weighted_mean(self, values: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
        return self._weighted_means([values], sizes)[0]

    def _weighted_means(self, columns: list[list[torch.Tensor]], sizes: list[int]) -> list[torch.Tensor]:
        """The sample-weighted mean of each column of per-batch values (``nan`` for none), global over
        ranks under torchrun (one all-reduce of sums and counts)."""
        device = self.learn.device
        weights = torch.tensor(sizes, dtype=torch.float32, device=device)
        if sizes:
            sums = (torch.stack([torch.stack(c).float().to(device) for c in columns]) * weights).sum(1)
        else:
            sums = torch.zeros(len(columns), device=device)
        if distributed.is_distributed():
            return list(distributed.weighted_means(sums, weights.sum()).unbind())
        return list((sums / weights.sum()).unbind())

    def _unmeasured_valid(self) -> dict[str, torch.Tensor]:
        nan = torch.tensor(math.nan, device=self.learn.device)
        return {"valid_loss": nan, **{name: nan for name in self.metric_names}}


def _own_share(state: dict[str, Any]) -> tuple[list[float], list[int]]:
    """This rank's training losses and batch sizes of a resumed epoch before the save. The ranks that
    saved together each take their own (every rank did as many batches); resumed by another number of
    processes, rank 0 carries them all, so each still counts once."""
    losses, sizes = list(state["epoch_losses"]), list(state["epoch_sizes"])
    saved_by, world, rank = state.get("epoch_ranks", 1), distributed.world_size(), distributed.rank()
    if saved_by == world:
        n = len(losses) // world
        return losses[rank * n : (rank + 1) * n], sizes[rank * n : (rank + 1) * n]
    return (losses, sizes) if rank == 0 else ([], [])


def _batch_size(item: Any) -> int:
    """Samples in a batch item: the first dim of a tensor, else ``len`` (e.g. a list of strings)."""
    return item.shape[0] if isinstance(item, torch.Tensor) else len(item)
