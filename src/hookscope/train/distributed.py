"""torchrun and DistributedDataParallel: who am I, reductions across ranks, and one fit's distributed setup.

The same script runs unchanged in one process or under ``torchrun --nproc-per-node N``: :class:`Session`
(entered by the Learner around every fit and validation) sees the environment torchrun sets, starts the
process group unless the user already did (gloo on CPU, nccl on CUDA), wraps the model in
``DistributedDataParallel`` for the training forward, shards the data, and destroys only what it created.

Sharding: the training loader gets a ``DistributedSampler`` (one seed for every rank, ``set_epoch`` each
epoch, so each epoch is one permutation split across ranks); the validation loader gets a
:class:`ShardSampler` — every ``world``-th sample, no padding — so a global mean over ranks counts every
validation sample exactly once (``DistributedSampler`` would repeat samples to even out the shards).
Validation runs on the user's module, not the DDP wrapper: shards may have different numbers of batches,
and the wrapper's per-forward buffer broadcast would then wait for a rank that has finished.

Every function here is also right in one process (world size 1): reductions return their input.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from hookscope.hooks.select import Spec, select
from hookscope.hooks.stats import local_part, several_ranks

if TYPE_CHECKING:
    from hookscope.train.data import DataLoaders
    from hookscope.train.learner import Learner

T = TypeVar("T")
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# How long a collective may wait for a rank before failing: bounded, so a rank that dies without closing
# its connections cannot hang the others for torch's default of 30 minutes.
TIMEOUT = timedelta(minutes=5)


class PeerFailedError(RuntimeError):
    """Another rank stopped (its own error is printed by that rank); this rank stops too."""


# ---- who am I ------------------------------------------------------------------------------------------


def launched_by_torchrun() -> bool:
    """True when the environment torchrun (or any ``env://`` launcher) sets is present."""
    return all(name in os.environ for name in _TORCHRUN_ENV)


def is_distributed() -> bool:
    """True inside an initialised process group of more than one rank."""
    return several_ranks()


def rank() -> int:
    """This process's global rank: from the process group, else torchrun's ``RANK``, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    """How many ranks: from the process group, else torchrun's ``WORLD_SIZE``, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    """This process's rank on its machine (torchrun's ``LOCAL_RANK``; 0 outside torchrun): its GPU index."""
    return int(os.environ.get("LOCAL_RANK", 0))


def is_rank_zero() -> bool:
    """True on the one rank that prints and writes files (and in a single process)."""
    return rank() == 0


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorate a function so that it runs on rank 0 only (returning None elsewhere)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if is_rank_zero() else None

    return wrapper


def device_for_rank(device: torch.device) -> torch.device:
    """Under torchrun, a CUDA device without index becomes this rank's GPU (``cuda:LOCAL_RANK``)."""
    if device.type == "cuda" and device.index is None and launched_by_torchrun():
        return torch.device("cuda", local_rank())
    return device


# ---- the process group ---------------------------------------------------------------------------------


def init_process_group(device: torch.device) -> bool:
    """Start the process group torchrun's environment describes, unless there is none to start or one is
    running already; returns True when this call created it (so the caller destroys it, and only it)."""
    if not launched_by_torchrun() or not dist.is_available() or dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=TIMEOUT)
    return True


def destroy_process_group() -> None:
    """End the process group; peers blocked in a collective with this rank fail at once, not at timeout."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _leave_group() -> None:
    """At exit, end a group kept for sharded parameters once every rank got there: a rank that tears
    its group down while a peer still talks to it can abort that peer (gloo)."""
    barrier()
    destroy_process_group()


# ---- reductions ----------------------------------------------------------------------------------------


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` reduced over every rank (``op``: ``sum``, ``max``, ``min``) as a new tensor on its device;
    the input itself is returned unchanged in one process."""
    if not is_distributed():
        return tensor
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    reduced = tensor.detach().clone()
    dist.all_reduce(reduced, op=ops[op])
    return reduced


def weighted_means(sums: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Global means from this rank's per-sample-weighted ``sums`` (one per quantity) and sample ``count``:
    sums and counts are added over ranks in ONE all-reduce, then divided — not a mean of the ranks' means,
    which would weigh a rank with fewer samples as much as one with more."""
    packed = all_reduce(torch.cat([sums.double().reshape(-1), count.double().reshape(1)]))
    return (packed[:-1] / packed[-1]).float()


def any_rank(flag: torch.Tensor) -> torch.Tensor:
    """True on every rank when ``flag`` (a bool tensor) is True on any rank: one all-reduce, on the device."""
    return all_reduce(flag.to(torch.uint8), "max").bool()


def barrier() -> None:
    """Wait until every rank gets here (nothing in one process).

    Under gloo this is ``monitored_barrier``: point to point from the calling thread. gloo's
    ``barrier()`` keeps the collectives still in flight when it starts (FSDP2's all-gather buffers)
    until a worker thread drops the barrier; near exit that can happen once the interpreter is
    finalizing, the thread cannot take the GIL to free them, and the process aborts with "terminate
    called without an active exception"."""
    if not is_distributed():
        return
    if dist.get_backend() == "gloo":
        dist.monitored_barrier()
    else:
        dist.barrier()


def broadcast_int(value: int) -> int:
    """Rank 0's ``value`` on every rank."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (plain values and tensors, pickled), in rank order, on every rank; ``[obj]`` in
    one process. For small things (RNG states, a checkpoint's per-rank part), not for tensors per step."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def from_peer(exc: BaseException) -> bool:
    """True when ``exc`` is a collective that failed because another rank went away."""
    text = str(exc)
    dist_error = getattr(dist, "DistError", ())
    return is_distributed() and (
        isinstance(exc, dist_error) or "Connection closed by peer" in text or "Connection reset" in text
    )


# ---- sharding ------------------------------------------------------------------------------------------


class ShardSampler(Sampler[int]):
    """Every ``world``-th index of ``n``, starting at ``rank``, in order and without padding: shards of
    sizes that differ by at most one, which together hold every sample exactly once (for validation)."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


def shard_loader(loader: Any, training: bool, seed: int) -> Any:
    """``loader`` rebuilt with this rank's shard (same batch size, collate, workers, generator...).

    A loader that already has a ``DistributedSampler``, or iterates an ``IterableDataset`` (which must
    shard itself), is returned as it is. A custom ``batch_sampler`` cannot be split and is refused.
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, DistributedSampler | ShardSampler):
        return loader
    if loader.batch_size is None:
        raise ValueError(
            f"Learner under torchrun: the {'training' if training else 'validation'} DataLoader has a custom "
            "batch_sampler, which hookscope cannot split across ranks; give it batch_size= and a sampler, "
            "or build it with a DistributedSampler yourself"
        )
    if training:
        shuffle = not isinstance(loader.sampler, SequentialSampler)
        if shuffle and not isinstance(loader.sampler, RandomSampler):
            raise ValueError(
                f"Learner under torchrun: the training DataLoader's {type(loader.sampler).__name__} cannot "
                "be split across ranks; use shuffle=True/False, or pass a DistributedSampler yourself"
            )
        sampler: Sampler[int] = DistributedSampler(
            loader.dataset, shuffle=shuffle, seed=seed, drop_last=loader.drop_last
        )
    else:
        sampler = ShardSampler(len(loader.dataset), rank(), world_size())
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell a ``DistributedSampler`` which epoch it is, so each epoch draws a new permutation."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(epoch)


def sampler_seed(loader: Any) -> int:
    """The shuffle seed every rank uses: rank 0's loader generator seed (or torch's initial seed)."""
    generator = getattr(loader, "generator", None)
    seed = generator.initial_seed() if isinstance(generator, torch.Generator) else torch.initial_seed()
    return broadcast_int(seed % 2**63)


# ---- FSDP2: sharded parameters ---------------------------------------------------------------------------


def is_sharded(model: nn.Module) -> bool:
    """True when ``model``'s parameters are sharded across ranks (DTensors: FSDP2's ``fully_shard``, tensor
    parallelism). Such a model runs its own collectives in forward and backward: it is not wrapped in DDP."""
    return any(local_part(p) is not p for p in model.parameters())


def refuse_fsdp1(model: nn.Module, who: str) -> None:
    """Refuse a model holding an FSDP1 ``FullyShardedDataParallel`` wrapper, in one line: its flat
    parameters are each rank's flattened slice (hookscope would name ``_fsdp_wrapped_module.*`` layers and
    read one rank's slice), and DDP cannot wrap it. Its module is looked up only once imported: whoever
    built an FSDP1 model imported it."""
    wrapper_type = getattr(sys.modules.get("torch.distributed.fsdp"), "FullyShardedDataParallel", None)
    if wrapper_type is None:
        return
    name = next((name for name, m in model.named_modules() if isinstance(m, wrapper_type)), None)
    if name is None:
        return
    where = f"at {name!r}" if name else "around the whole model"
    raise TypeError(
        f"{who}: the model holds an FSDP1 FullyShardedDataParallel wrapper ({where}), whose flat "
        "parameters are each rank's flattened slice: hookscope would name _fsdp_wrapped_module.* layers "
        "and read one rank's slice; shard with FSDP2 instead (torch.distributed.fsdp.fully_shard per "
        "block, then the root, or Learner(shard=True)), which it reads whole under your module names"
    )


def default_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks :func:`shard_model` wraps by default: the entries holding parameters of the outermost
    ``nn.ModuleList`` / ``nn.Sequential`` containers (a transformer's layers, a ResNet's stages, a
    Sequential's layers), in model order. Each becomes one FSDP2 unit: its parameters are gathered just
    before it runs and freed after, so memory holds one block whole at a time."""
    blocks: list[tuple[str, nn.Module]] = []
    containers = (nn.ModuleList, nn.Sequential)

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            qualified = f"{prefix}{name}"
            if isinstance(module, containers) and next(child.parameters(), None) is not None:
                blocks.append((qualified, child))
            else:
                visit(f"{qualified}.", child)

    visit("", model)
    return blocks


def shard_model(model: nn.Module, blocks: Spec | bool, mp_policy: Any = None) -> list[str]:
    """Apply FSDP2's ``fully_shard`` to each block of ``model`` (``True``: :func:`default_blocks`; else a
    selection as :func:`hookscope.select` reads it), then to the root, in place; returns the blocks'
    names. ``mp_policy``: an FSDP2 ``MixedPrecisionPolicy`` (parameters gathered and computed in low
    precision, gradients reduced in float32). Needs the process group."""
    from torch.distributed.fsdp import fully_shard

    chosen = default_blocks(model) if blocks is True else select(model, blocks)
    options = {} if mp_policy is None else {"mp_policy": mp_policy}
    for _, module in reversed(chosen):  # reversed model order: children before their parents
        fully_shard(module, **options)
    fully_shard(model, **options)
    return [name for name, _ in chosen]


# ---- one fit under torchrun ----------------------------------------------------------------------------


@dataclass
class Session:
    """The distributed setup of one Learner: entered around each fit (re-entrant, for ``lr_find`` inside a
    fit), it starts the process group when torchrun launched us, wraps the model, shards the data; leaving
    it puts the user's loaders back and destroys the group if it created it.

    ``seed``: the training sampler's shuffle seed (kept in checkpoints so a resume shuffles the same).
    """

    ddp: nn.Module | None = None
    seed: int | None = None
    blocks: list[str] = field(default_factory=list)  # the FSDP2 units Learner(shard=...) made
    _depth: int = 0
    _created: bool = False
    _user_dls: DataLoaders | None = None
    _sharded: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    @contextlib.contextmanager
    def active(self, learn: Learner) -> Iterator[None]:
        """Set up on entry (outermost only), take down on exit — also when the body raised."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth = 1
        try:
            self._start(learn)
            yield
        finally:
            self._depth = 0
            self._stop(learn)

    def shard(self, learn: Learner, blocks: Spec | bool, mp_policy: Any = None) -> None:
        """``Learner(shard=...)``: under torchrun, start the process group and shard ``learn.model`` in
        place with FSDP2 (:func:`shard_model`) before any optimizer is built on its parameters. The group
        then lives until the process exits, as the parameters do; in one process nothing changes."""
        self._created = init_process_group(learn.device) or self._created
        if not is_distributed() or is_sharded(learn.model):
            return
        self.blocks = shard_model(learn.model, blocks, mp_policy)
        if self._created:
            atexit.register(_leave_group)

    def set_gradient_sync(self, model: nn.Module, enabled: bool) -> None:
        """Whether the next forward and backward reduce gradients across ranks: off for all but the last
        micro-batch of an accumulated step (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``),
        so an accumulated step costs one reduction, not one per micro-batch."""
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = enabled  # what DDP's no_sync() context sets
        set_sync = getattr(model, "set_requires_gradient_sync", None)
        if set_sync is not None and is_distributed():
            set_sync(enabled)

    def _start(self, learn: Learner) -> None:
        self._created = init_process_group(learn.device) or self._created
        if not is_distributed():
            return
        self.seed = sampler_seed(learn.dls.train) if self.seed is None else self.seed
        sharded = is_sharded(learn.model)
        if not sharded:  # FSDP2 modules reduce their own gradients: no DDP around them
            ids = [learn.device.index] if learn.device.type == "cuda" else None
            self.ddp = nn.parallel.DistributedDataParallel(learn.model, device_ids=ids)
        self._user_dls = learn.dls
        dls = learn.dls
        # Validation of a sharded model stays whole on every rank: each forward gathers parameters with
        # every rank, so all must run as many batches (shards of the validation set may differ by one).
        valid = dls.valid if dls.valid is None or sharded else self._shard(dls.valid, training=False)
        # the same kind of DataLoaders over the sharded loaders (train.data imports this module, not back)
        learn.dls = type(dls)(self._shard(dls.train, training=True), valid, in_memory=dls.in_memory)

    def _shard(self, loader: Any, training: bool) -> Any:
        """The sharded loader of ``loader``, made once per Learner (so in-memory copies are made once)."""
        cached = self._sharded.get(id(loader))
        if cached is None or cached[0] is not loader:
            cached = (loader, shard_loader(loader, training, self.seed or 0))
            self._sharded[id(loader)] = cached
        return cached[1]

    def release_peers(self) -> None:
        """After a failure on this rank: destroy the process group if we created it, so that the other
        ranks' pending collectives fail at once (a group the user created is theirs to end)."""
        self.ddp = None
        if self._created:
            destroy_process_group()
            self._created = False

    def _stop(self, learn: Learner) -> None:
        if self._user_dls is not None:
            learn.dls, self._user_dls = self._user_dls, None
        if is_sharded(learn.model):
            self.ddp = None  # the group stays: the sharded parameters live on it
            return
        self.release_peers()
