"""The Learner: a training loop that fires fastai's events to callbacks, and nothing else.

Everything beyond forward, loss, backward and step — recording, progress, schedules, clipping, precision,
checkpoints, monitoring — is a callback. The loop below fires the events in the order of ``EVENTS``; a
stage's cancel exception skips the rest of that stage (``after_cancel_<stage>`` then ``after_<stage>``
fire); any other exception fires ``on_failure(exc)`` on every callback and propagates unchanged.

The loop and the callback catalogue: the loop itself names one callback, the Recorder, which lives beside it
(``train/recorder.py``) because :meth:`Learner.validate` returns what it measures. fastai's conveniences —
``fit_one_cycle``, ``lr_find``, ``to_fp16`` / ``to_bf16`` / ``to_fp32``, ``no_bar`` and the default
ProgressBar — are built-in callbacks by definition. They stay methods of the Learner (the public API users
know) and reach ``hookscope.callbacks`` through one function, :func:`_catalogue`, when such a method runs,
never at import. The alternatives were worse: fastai patches each method onto the class from the callback's
module (monkey-patching, and a method exists only once its module was imported); a registry that the
callbacks package fills has the same trap (empty until someone imports the package), so the loop would
still have to import it. Here ``train/`` imports nothing from ``callbacks/`` at import time, and the one
place it names the catalogue is a single greppable function.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.hooks.batch import split_batch
from hookscope.hooks.select import Spec
from hookscope.hooks.summary import Summary, summary
from hookscope.hooks.tensors import model_device
from hookscope.train import checkpoint, distributed
from hookscope.train.callback import Callback, as_callbacks, dispatch_table, sort_callbacks
from hookscope.train.data import (
    DataLoaders,
    TensorBatches,
    as_dataloaders,
    batch_to_device,
    can_batch_in_memory,
    require_batches,
    to_device,
)
from hookscope.train.events import (
    CancelBackwardException,
    CancelBatchException,
    CancelEpochException,
    CancelFitException,
    CancelStepException,
    CancelTrainException,
    CancelValidException,
)
from hookscope.train.recorder import Recorder

if TYPE_CHECKING:
    from hookscope.callbacks.lr_finder import LRFindResult


class Learner:
    """Trains ``model`` on ``dls`` with ``loss_func``; callbacks see and change the loop state via ``learn``.

    State a callback may read or write (fastai's names): ``model, dls, loss_func, opt_func, opt, lr,
    metrics, cbs, n_epoch, epoch, dl, n_iter, iter, train_iter, pct_train, training, xb, yb, pred,
    loss_grad, loss``, plus ``training_step`` (optimizer steps taken) and ``device``. ``xb`` and ``yb`` are
    tuples: ``pred = model(*xb)``, ``loss_grad = loss_func(pred, *yb)``. A batch is split into
    ``xb = batch[:-1]`` and ``yb = batch[-1:]`` (a lone tensor is an input with no target).
    ``valid_record`` holds the loss and metrics of the latest validation phase as device tensors: the
    Recorder writes it at ``after_validate``, and :meth:`validate` reads it (see there).

    The default callbacks (a Recorder, and a ProgressBar when stdout is a terminal) are added unless
    ``cbs`` holds one of the same type; ``progress=False`` leaves the bar out.

    Under ``torchrun`` the same code trains on every rank (``train/distributed.py``): each fit wraps the
    model in ``DistributedDataParallel`` for the training forward and shards the data (``learn.model``
    stays the user's module, ``learn.distributed`` holds the setup); callbacks with ``rank_zero_only =
    True`` run on rank 0 only. ``shard`` shards the model with FSDP2 instead (``True``: one unit per
    block, see :func:`~hookscope.train.distributed.default_blocks`; or a selection of the blocks, as
    :func:`hookscope.select` reads it); a model the user sharded with ``fully_shard`` is trained as it is.
    """

    def __init__(
        self,
        model: nn.Module,
        dls: DataLoaders | Sequence[Any],
        loss_func: Callable[..., torch.Tensor],
        opt_func: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
        lr: float = 1e-3,
        metrics: Iterable[Any] = (),
        cbs: Iterable[Callback | type[Callback]] | Callback | type[Callback] = (),
        device: torch.device | str | None = None,
        progress: bool | None = None,
        shard: Spec | bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Learner: model must be a torch.nn.Module, not {type(model).__name__}")
        if not callable(loss_func):
            raise TypeError(f"Learner: loss_func must be callable as loss_func(pred, *yb), not {loss_func!r}")
        _refuse_meta(model)
        distributed.refuse_fsdp1(model, "Learner")
        _refuse_raw_tensors(dls)
        self.device = distributed.device_for_rank(
            torch.device(device) if device is not None else model_device(model)
        )
        self.distributed = distributed.Session()
        self.model = model.to(self.device)
        self.dls = as_dataloaders(dls)
        self.loss_func, self.opt_func, self.lr = loss_func, opt_func, lr
        self.metrics = _as_list(metrics)
        self.opt: torch.optim.Optimizer | None = None
        self.n_epoch, self.epoch, self.n_iter, self.iter, self.train_iter = 0, 0, 0, 0, 0
        self.training_step, self.pct_train, self.training = 0, 0.0, False
        self.dl: Any = None
        self.xb: tuple = ()
        self.yb: tuple = ()
        self.pred: Any = None
        self.loss_grad: torch.Tensor | None = None
        self.loss: torch.Tensor | None = None
        self.valid_record: dict[str, torch.Tensor] = {}
        self.resumed_from: Path | None = None  # the checkpoint the current fit continues, if any
        self.cbs: list[Callback] = []
        self._fast_sources: dict[int, TensorBatches] = {}
        self.epoch_rng: dict[str, Any] | None = None  # RNGs at this epoch's start, for mid-epoch resume
        self._resume: checkpoint.Resume | None = None
        # saved states of objects callbacks build during fit, given to them before the first batch
        self.pending_objects: list[checkpoint.PendingObject] = []
        cbs = as_callbacks(cbs)
        defaults = _default_callbacks(progress)
        self.add_cbs([d for d in defaults if not any(isinstance(cb, type(d)) for cb in cbs)] + cbs)
        if shard is not False:  # FSDP2 under torchrun, before the optimizer takes the parameters
            self.distributed.shard(self, shard, _shard_precision(self.cbs, self.device))
        for cb in sort_callbacks(self.cbs):
            if hasattr(cb, "after_create"):
                cb.after_create()

    # ---- callbacks -----------------------------------------------------------------------------------

    def add_cb(self, cb: Callback) -> None:
        """Attach ``cb``: it gets ``cb.learn`` and is reachable as ``learn.<cb.name>``; its companions
        (:attr:`Callback.companions`) are attached right after it, without a ``learn.<name>``."""
        existing = getattr(self, cb.name, None)
        if existing is not None:
            kind = "callback" if isinstance(existing, Callback) else "Learner attribute"
            raise ValueError(
                f"Learner.add_cb: the name {cb.name!r} of {type(cb).__name__} is taken by a {kind}; "
                "remove that callback first, or subclass with another name"
            )
        setattr(self, cb.name, cb)
        self._attach(cb)

    def _attach(self, cb: Callback) -> None:
        cb.learn = self
        self.cbs.append(cb)
        for companion in cb.companions:
            self._attach(companion)

    def add_cbs(self, cbs: Iterable[Callback]) -> None:
        for cb in cbs:
            self.add_cb(cb)

    def remove_cb(self, cb: Callback | type[Callback]) -> None:
        """Detach ``cb``, or every callback of the class ``cb`` (fastai's ``remove_cb(SomeCallback)``); the
        attribute ``learn.<cb.name>`` and ``cb.learn`` go with it."""
        if isinstance(cb, type):
            for member in [c for c in self.cbs if isinstance(c, cb)]:
                self.remove_cb(member)
            return
        self.cbs.remove(cb)
        if getattr(self, cb.name, None) is cb:
            delattr(self, cb.name)
        cb.learn = None
        for companion in cb.companions:
            if companion in self.cbs:
                self.remove_cb(companion)

    def remove_cbs(self, cbs: Iterable[Callback | type[Callback]]) -> None:
        """Detach each of ``cbs`` (instances or classes), as :meth:`remove_cb` does."""
        for cb in list(cbs):
            self.remove_cb(cb)

    @contextlib.contextmanager
    def no_bar(self) -> Iterator[Learner]:
        """No progress bar inside the block (fastai's ``learn.no_bar()``); the bar comes back after it."""
        bars = [cb for cb in self.cbs if isinstance(cb, _catalogue().ProgressBar)]
        self.remove_cbs(bars)
        try:
            yield self
        finally:
            self.add_cbs(bars)

    no_mbar = no_bar  # fastai's name for hiding the epoch bar: hookscope draws one bar for both

    def to_fp16(self, **mixed_precision: Any) -> Learner:
        """Train in float16 autocast with a grad scaler (a ``MixedPrecision`` callback); returns ``self``."""
        return self._set_precision(torch.float16, mixed_precision)

    def to_bf16(self, **mixed_precision: Any) -> Learner:
        """Train in bfloat16 autocast (a ``MixedPrecision`` callback); returns ``self``."""
        return self._set_precision(torch.bfloat16, mixed_precision)

    def to_fp32(self) -> Learner:
        """Train in full precision again: removes the ``MixedPrecision`` callback; returns ``self``."""
        self.remove_cb(_catalogue().MixedPrecision)
        return self

    def _set_precision(self, dtype: torch.dtype, mixed_precision: dict[str, Any]) -> Learner:
        self.to_fp32()
        self.add_cb(_catalogue().MixedPrecision(dtype=dtype, **mixed_precision))
        return self

    @property
    def x(self) -> Any:
        """The batch's (first) input, ``xb[0]`` (fastai's ``learn.x``)."""
        return self.xb[0]

    @property
    def y(self) -> Any:
        """The batch's target, ``yb[0]`` (fastai's ``learn.y``)."""
        return self.yb[0]

    def show_training_loop(self) -> None:
        """Print the event sequence of one fit and the callbacks (in order) that run at each event."""
        train, valid = self._resolve()
        print(format_training_loop(train, valid))

    # ---- the loop ------------------------------------------------------------------------------------

    def create_opt(self) -> None:
        """``learn.opt = opt_func(params, lr=lr)``; the default AdamW is fused on CUDA (see
        :func:`_fused_default`)."""
        self.opt = self.opt_func(
            self.model.parameters(), lr=self.lr, **_fused_default(self.opt_func, self.model)
        )

    def save(self, path: str | Path) -> Path:
        """Write the full state (model, optimizer, callbacks, RNGs, loop position) to ``path`` atomically;
        the file loads with ``torch.load(weights_only=True)`` (see ``train/checkpoint/``)."""
        return checkpoint.save_learner(self, path)

    def load(self, path: str | Path) -> None:
        """Load model, optimizer and callback states saved by :meth:`save` (refusing pickled objects);
        ``fit(n, resume=path)`` continues the saved run instead of starting at epoch 0."""
        checkpoint.load_learner(self, path)

    def fit(
        self,
        n_epoch: int,
        lr: float | None = None,
        cbs: Iterable[Callback | type[Callback]] | Callback | type[Callback] | None = None,
        resume: str | Path | None = None,
    ) -> None:
        """Train for ``n_epoch`` epochs; ``cbs`` are attached for this call only (removed also on error).

        ``resume`` (a checkpoint file, a folder holding ``last.pt``, or ``"last"`` for the Checkpoint
        callback's newest) continues a saved run at the batch where it stopped.
        """
        require_batches(self.dls.train, "Learner.fit")
        added = as_callbacks(cbs)
        self.add_cbs(added)
        try:
            if self.opt is None:
                self.create_opt()
            # Every fit starts from learn.lr, not where a previous schedule left the optimizer (fastai's
            # set_hypers(lr=...)); a resumed fit then loads the checkpoint's optimizer state over it.
            self._set_lr(self.lr if lr is None else lr)
            self.n_epoch, self.train_iter, self.pct_train = n_epoch, 0, 0.0
            self._resume = checkpoint.Resume.start(self, resume) if resume is not None else None
            self.resumed_from = Path(self._resume.source) if self._resume else None
            self._run(self._do_fit, "fit", CancelFitException)
        finally:
            self._resume = None
            for cb in added:
                self.remove_cb(cb)

    def fit_one_cycle(
        self,
        n_epoch: int,
        lr_max: float | None = None,
        cbs: Iterable[Callback | type[Callback]] | Callback | type[Callback] | None = None,
        resume: str | Path | None = None,
        **one_cycle: Any,
    ) -> None:
        """``fit`` under the 1cycle policy (``hs.callbacks.OneCycle(lr_max, **one_cycle)``, whose parameters
        and defaults are those of ``torch.optim.lr_scheduler.OneCycleLR``); ``lr_max=None`` uses ``lr``."""
        self.fit(n_epoch, cbs=[_catalogue().OneCycle(lr_max, **one_cycle), *as_callbacks(cbs)], resume=resume)

    def lr_find(
        self,
        start_lr: float = 1e-7,
        end_lr: float = 10.0,
        num_it: int = 100,
        stop_div: bool = True,
        show_plot: bool = False,
    ) -> LRFindResult:
        """Sweep the lr exponentially and return the losses and a suggested lr (``.suggested_lr``,
        ``.plot()``); the weights and optimizer state are restored afterwards."""
        return _catalogue().find_lr(self, start_lr, end_lr, num_it, stop_div, show_plot)

    def one_batch(self, dl: Any = None) -> tuple:
        """The first batch of ``dl`` (default: the training loader) on the device, as a tuple. No callback
        runs, and every RNG (global and the loader's generator) is left as it was, so a later ``fit`` is
        unchanged (fastai's ``dls.one_batch``)."""
        dl = self.dls.train if dl is None else dl
        generator = getattr(dl, "generator", None)
        loader_rng = generator.get_state() if generator is not None else None
        with torch.random.fork_rng(devices=[]):
            batch = next(iter(self._batches(dl)), None)
        if loader_rng is not None:
            generator.set_state(loader_rng)
        if batch is None:
            raise ValueError("Learner.one_batch: the loader yielded no batch; give it some data")
        return batch

    def summary(self, depth: int | None = None) -> Summary:
        """``hs.summary`` of the model on the inputs of one training batch (see :meth:`one_batch`)."""
        return summary(self.model, split_batch(self.one_batch())[0], depth=depth)

    def _do_fit(self) -> None:
        start = self._resume.after_before_fit(self) if self._resume else 0
        for epoch in range(start, self.n_epoch):
            self.epoch = epoch
            self._with_events(self._do_epoch, "epoch", CancelEpochException)

    def _do_epoch(self) -> None:
        self._phase(self.dls.train, training=True)
        if self.dls.valid is not None:
            self._phase(self.dls.valid, training=False)

    def _phase(self, dl: Any, training: bool) -> None:
        self.dl, self.n_iter, self.training = dl, len(dl), training
        self.model.train(training)
        self._events = self._train_events if training else self._valid_events
        if training:
            distributed.set_epoch(dl, self.epoch)
            self.pct_train = (self.epoch + self._batches_done()) / self.n_epoch
            self._with_events(self._all_batches, "train", CancelTrainException)
            return
        with torch.no_grad():
            self._with_events(self._all_batches, "validate", CancelValidException)

    def _all_batches(self) -> None:
        if self.training:
            start, batches = checkpoint.train_batches(self, self._resume, self._batches)
        else:
            start, batches = 0, self._batches(self.dl)
        for i, batch in enumerate(batches, start):
            self.iter = i
            self.xb, self.yb = split_batch(batch)
            self.pred = self.loss_grad = self.loss = None
            self._one_batch()

    def _one_batch(self) -> None:
        """The batch events. The training counters count this batch before ``after_batch`` (as fastai's
        TrainEvalCallback does): ``after_batch`` sees ``train_iter`` and ``pct_train`` counting it."""
        try:
            self._fire("before_batch")
            self._do_batch()
        except CancelBatchException:
            self._fire("after_cancel_batch")
        if self.training:
            self.train_iter += 1
            self.pct_train = (self.epoch + (self.iter + 1) / self.n_iter) / self.n_epoch
        self._fire("after_batch")

    def _batches_done(self) -> float:
        """The fraction of this epoch's training batches already done: 0, or where a resume continues."""
        resume = self._resume
        done = resume.position.iter if resume is not None and resume.mid_epoch_pending else 0
        return done / self.n_iter

    def _do_batch(self) -> None:
        if self.training and not self.yb:
            _refuse_no_targets(self.xb)
        # Training goes through the DDP wrapper (its backward averages gradients over ranks); validation
        # through the user's module, as shards may differ in length (see train/distributed.py).
        ddp = self.distributed.ddp
        self.pred = (ddp if ddp is not None and self.training else self.model)(*self.xb)
        self._fire("after_pred")
        if not self.yb:
            return  # a validation batch without target: nothing to score
        self.loss_grad = _checked_loss(self.loss_func(self.pred, *self.yb), self.loss_func)
        # A copy, not a view: a callback that scales loss_grad in place must not change the recorded loss.
        self.loss = self.loss_grad.detach().clone()
        self._fire("after_loss")
        if not self.training:
            return
        self._with_events(self._backward, "backward", CancelBackwardException)
        self._with_events(self._step, "step", CancelStepException)
        self.opt.zero_grad()

    def _backward(self) -> None:
        self.loss_grad.backward()

    def _step(self) -> None:
        self.opt.step()
        self.training_step += 1

    # ---- evaluation ----------------------------------------------------------------------------------

    def validate(self, dl: Any = None) -> dict[str, float]:
        """Run the validation phase on ``dl`` (default: the valid loader); returns loss and metrics.

        The Recorder measures them and writes them to ``valid_record`` at ``after_validate``; they are read
        here in one transfer. A Learner whose Recorder was removed gets one for this call only.
        """
        dl = self._eval_loader(dl, "validate")
        added = [] if any(isinstance(cb, Recorder) for cb in self.cbs) else [Recorder()]
        self.add_cbs(added)
        try:
            self.valid_record = {}
            self._run(lambda: self._phase(dl, training=False), None, None)
        finally:
            self.remove_cbs(added)
        names = list(self.valid_record)
        values = torch.stack([self.valid_record[n].float() for n in names]).tolist()
        return dict(zip(names, values, strict=True))

    def get_preds(self, dl: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Predictions and targets over ``dl`` (default: valid loader), in eval mode, without callbacks."""
        dl = self._eval_loader(dl, "get_preds")
        preds, targets = [], []
        with self._evaluating():
            for batch in self._batches(dl):
                xb, yb = split_batch(batch)
                preds.append(self.model(*xb))
                targets.extend(yb)
        return torch.cat(preds), torch.cat(targets) if targets else None

    def predict(self, x: torch.Tensor | tuple) -> Any:
        """The model's output for a batch ``x`` (or a tuple of inputs), in eval mode and without grad."""
        inputs = to_device(x if isinstance(x, tuple) else (x,), self.device)
        with self._evaluating():
            return self.model(*inputs)

    def _eval_loader(self, dl: Any, method: str) -> Any:
        if dl is None and self.dls.valid is None:
            raise ValueError(
                f"Learner.{method}: no validation data; pass {method}(dl) or a valid loader to dls"
            )
        return self.dls.valid if dl is None else dl

    # ---- machinery -----------------------------------------------------------------------------------

    def _run(self, body: Callable[[], None], stage: str | None, cancel: type[Exception] | None) -> None:
        """Resolve the dispatch tables, run ``body`` (as a cancellable stage), and report failures."""
        self._train_events, self._valid_events = self._resolve()
        self._events = self._train_events
        with self.distributed.active(self):
            try:
                if stage is None:
                    body()
                else:
                    self._with_events(body, stage, cancel)
            except BaseException as exc:
                self._fail_everywhere(exc)
            finally:
                self.training = False

    def _fail_everywhere(self, exc: BaseException) -> None:
        """Release the other ranks first (they fail at once in their next collective instead of waiting
        for a timeout), report ``exc`` to the callbacks, and re-raise it; a collective broken by another
        rank's failure becomes one short :class:`~hookscope.train.distributed.PeerFailedError`, so the
        original error is printed once, by the rank it happened on."""
        peer = distributed.from_peer(exc)
        self.distributed.release_peers()
        if not peer:
            self._fail(exc)
            raise exc
        error = distributed.PeerFailedError(
            f"rank {distributed.rank()} stopped because another rank failed (its error is printed by that "
            f"rank): {str(exc).splitlines()[0][:200]}"
        )
        self._fail(error)
        raise error from None

    def _with_events(self, body: Callable[[], None], stage: str, cancel: type[Exception]) -> None:
        try:
            self._fire(f"before_{stage}")
            body()
        except cancel:
            self._fire(f"after_cancel_{stage}")
        self._fire(f"after_{stage}")

    def _fire(self, event: str) -> None:
        for method in self._events[event]:
            method()

    def _fail(self, exc: BaseException) -> None:
        """Fire ``on_failure(exc)`` on every callback; a failing handler is reported, never masks ``exc``."""
        for method in self._events["on_failure"]:
            try:
                method(exc)
            except Exception as handler_error:
                warnings.warn(
                    f"{method.__qualname__} raised {handler_error!r} while handling {exc!r}", stacklevel=2
                )

    def _resolve(self) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        ordered = sort_callbacks(self.cbs)
        if not distributed.is_rank_zero():
            ordered = [cb for cb in ordered if not getattr(cb, "rank_zero_only", False)]
        return dispatch_table(ordered, training=True), dispatch_table(ordered, training=False)

    def _batches(self, dl: Any) -> Iterable[tuple]:
        """Batches of ``dl`` on the device: by indexing in-memory tensors when equivalent, else by loading.

        The device copies of ``dls.train`` / ``dls.valid`` are made once; other loaders' on each call.
        """
        if not (self.dls.in_memory and can_batch_in_memory(dl)):
            return (batch_to_device(b, self.device) for b in dl)
        if dl is not self.dls.train and dl is not self.dls.valid:
            return TensorBatches(dl, self.device)
        if id(dl) not in self._fast_sources:
            self._fast_sources[id(dl)] = TensorBatches(dl, self.device)
        return self._fast_sources[id(dl)]

    def _set_lr(self, lr: float) -> None:
        self.lr = lr
        for group in self.opt.param_groups if self.opt is not None else ():
            group["lr"] = lr

    def _evaluating(self) -> _Evaluating:
        return _Evaluating(self.model)


class _Evaluating:
    """Eval mode and no grad for a block; the model's previous mode comes back afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training
        self.no_grad = torch.no_grad()

    def __enter__(self) -> None:
        self.model.eval()
        self.no_grad.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


def _fused_default(opt_func: Callable[..., Any], model: nn.Module) -> dict[str, bool]:
    """``fused=True`` for the default AdamW when every parameter is a plain floating CUDA tensor (not a
    sharded one): one kernel per update instead of a dozen, and an optimizer that can leave a non-finite
    step out on the device, so the NonFiniteGuard reads its verdict without stalling the GPU."""
    params = list(model.parameters())
    plain_cuda = bool(params) and all(
        p.device.type == "cuda" and p.is_floating_point() and type(p.data) is torch.Tensor for p in params
    )
    return {"fused": True} if opt_func is torch.optim.AdamW and plain_cuda else {}


def _refuse_meta(model: nn.Module) -> None:
    """Refuse a model whose tensors are on the meta device: they have shapes but no values to train."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    on_meta = [name for name, t in tensors if t.is_meta]
    if not on_meta:
        return
    more = f" and {len(on_meta) - 5} more" if len(on_meta) > 5 else ""
    raise ValueError(
        f"Learner: {len(on_meta)} parameter(s)/buffer(s) of {type(model).__name__} are on the meta device "
        f"(shapes, no values): {', '.join(on_meta[:5])}{more}; materialise them first with "
        "model.to_empty(device='cpu' or 'cuda'), then initialise them (reset_parameters()) or load the "
        "weights (load_state_dict)"
    )


def _checked_loss(loss: Any, loss_func: Callable[..., Any]) -> torch.Tensor:
    """``loss`` if it is a tensor; else a one-line TypeError naming ``loss_func``, what it gave and the fix.

    An isinstance test costs no device sync, so it runs on every batch (not just the first).
    """
    if isinstance(loss, torch.Tensor):
        return loss
    name = getattr(loss_func, "__qualname__", type(loss_func).__name__)
    raise TypeError(
        f"Learner: loss_func {name} returned {type(loss).__name__} ({loss!r:.40}), not a torch.Tensor; "
        "compute the loss with torch operations and return the tensor (e.g. F.cross_entropy(pred, target)); "
        ".item(), float() or numpy cut it from the gradient"
    )


def _refuse_raw_tensors(dls: Any) -> None:
    """Refuse tensors where loaders belong: ``Learner(model, (x, y), loss)`` would iterate their rows."""
    items = dls if isinstance(dls, tuple | list) else (dls,)
    if not any(isinstance(item, torch.Tensor) for item in items):
        return
    raise TypeError(
        f"Learner: dls is {_describe(items)}: raw tensors, not loaders of batches; pass "
        "hs.DataLoaders.from_tensors(x, y, batch_size=64) (or hs.DataLoaders(train_loader, valid_loader))"
    )


def _refuse_no_targets(xb: tuple) -> None:
    """Refuse a training batch without target: no loss, so no step — the fit would do nothing, silently."""
    raise ValueError(
        f"Learner.fit: the training batches have no targets (one item each: {_describe(xb)}), so "
        "loss_func(pred, *yb) has nothing to compare with and nothing would train; make the loader yield "
        "(x, y) batches, e.g. hs.DataLoaders.from_tensors(x, y, batch_size=64)"
    )


def _describe(items: Iterable[Any]) -> str:
    """``(Tensor[1024, 32], Tensor[1024])``: what the user gave, by type and shape."""
    parts = [
        f"Tensor[{', '.join(map(str, item.shape))}]"
        if isinstance(item, torch.Tensor)
        else type(item).__name__
        for item in items
    ]
    return f"({', '.join(parts)})"


def _as_list(items: Any) -> list[Any]:
    """A single metric, or an iterable of them, as a list (fastai accepts both)."""
    return [items] if callable(items) else list(items)


def _shard_precision(cbs: list[Callback], device: torch.device) -> Any:
    """The FSDP2 ``MixedPrecisionPolicy`` a callback asks the sharding for (``MixedPrecision`` does, through
    ``fsdp_policy``), or None: parameters and gradients then stay in their own dtype."""
    policies = [cb.fsdp_policy(device.type) for cb in cbs if hasattr(cb, "fsdp_policy")]
    return policies[0] if policies else None


def _default_callbacks(progress: bool | None) -> list[Callback]:
    """A Recorder, and a ProgressBar when ``progress`` (default: where a bar is seen, see ProgressBar)."""
    bar = _catalogue().ProgressBar
    show_bar = bar.is_seen() if progress is None else progress
    return [Recorder()] + ([bar()] if show_bar else [])


def _catalogue() -> ModuleType:
    """The built-in callbacks (``hookscope.callbacks``, lazy), for the convenience methods: the one place the
    loop names its catalogue, imported when such a method runs (see the module docstring)."""
    import hookscope.callbacks

    return hookscope.callbacks


_LAYOUT = (
    (0, "after_create"),
    (0, "before_fit"),
    (1, "before_epoch"),
    (2, "before_train"),
    *((3, e) for e in ("before_batch", "after_pred", "after_loss", "before_backward", "after_backward")),
    *((3, e) for e in ("before_step", "after_step", "after_batch")),
    (2, "after_train"),
    (2, "before_validate"),
    *((3, e) for e in ("before_batch", "after_pred", "after_loss", "after_batch")),
    (2, "after_validate"),
    (1, "after_epoch"),
    (0, "after_fit"),
    (0, "on_failure"),
)


def format_training_loop(train: dict[str, list[Any]], valid: dict[str, list[Any]]) -> str:
    """One line per event of a fit, indented by nesting, with the callbacks that run there; then the
    ``after_cancel_*`` events that some callback handles."""
    lines, in_valid = [], False
    for depth, event in _LAYOUT:
        in_valid = (in_valid or event == "before_validate") and event != "after_validate"
        methods = (valid if in_valid else train)[event]
        lines.append(f"{'  ' * depth}{event:<{22 - 2 * depth}} {_owners(methods) or '-'}")
    for event in (e for e in train if e.startswith("after_cancel_")):
        in_train = {id(method_owner(m)) for m in train[event]}
        owners = _owners(train[event] + [m for m in valid[event] if id(method_owner(m)) not in in_train])
        if owners:
            lines.append(f"{event:<22} {owners}")
    return "\n".join(lines)


def _owners(methods: list[Any]) -> str:
    return ", ".join(_owner_name(m) for m in methods)


def _owner_name(method: Any) -> str:
    owner = method_owner(method)
    return getattr(method, "__qualname__", repr(method)) if owner is None else type(owner).__name__


def method_owner(method: Any) -> Any:
    """The object whose bound method ``method`` is, under any number of wrappers (``CallbackCost``, the
    doctor's timing): the first ``__self__`` along the ``__wrapped__`` chain that ``functools.wraps`` leaves.
    None when no wrapper in the chain leads back to a bound method."""
    while method is not None:
        owner = getattr(method, "__self__", None)
        if owner is not None:
            return owner
        method = getattr(method, "__wrapped__", None)
    return None
