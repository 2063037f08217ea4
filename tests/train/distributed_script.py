"""A tiny training script that the distributed tests run unchanged in one process or under torchrun.

Each rank writes ``<out>/rank<r>.pt``: final weights, history, findings, per-layer statistics, and what it
saw (world size, batches per epoch). Options (see ``main``) choose the data split, a fault on one rank,
checkpoints and resume, the doctor, and a pause after a given step (so a test can ``kill -9`` the job).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.train import checkpoint, distributed


class Fault(hs.Callback):
    """On ``rank``: from ``step`` on, make the inputs NaN (``nan``), raise (``raise``) or die (``kill``);
    ``inf-grad``: once, at ``step``, an Inf in this rank's own part of the first layer's gradient (an
    overflow in one shard: under float16 every rank must skip that step, or the ranks part)."""

    order = -30

    def __init__(self, kind: str, rank: int, step: int) -> None:
        self.kind, self.rank, self.step = kind, rank, step
        self.done = False

    def after_backward(self) -> None:
        if self.kind != "inf-grad" or distributed.rank() != self.rank or self.done:
            return
        if self.learn.training_step == self.step:
            grad = self.learn.model[0].weight.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[0] = float("inf")
            self.done = True

    def before_batch(self) -> None:
        learn = self.learn
        if distributed.rank() != self.rank or not learn.training or learn.training_step < self.step:
            return
        if self.kind == "inf-grad":
            return
        if self.kind == "raise":
            raise ValueError(f"injected failure on rank {self.rank} at step {learn.training_step}")
        if self.kind == "kill":  # the process dies at once, as on a machine that fails
            os.kill(os.getpid(), signal.SIGKILL)
        learn.xb = (torch.full_like(learn.xb[0], float("nan")),)


class PauseAt(hs.Callback):
    """After optimizer step ``step``: write this process's id to ``<out>/paused<rank>`` and sleep for
    ``seconds`` (the test kills or interrupts the job there)."""

    order = 100

    def __init__(self, step: int, out: Path, seconds: float) -> None:
        self.step, self.out, self.seconds = step, out, seconds

    def after_batch(self) -> None:
        if self.learn.training_step == self.step:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"paused{distributed.rank()}").write_text(str(os.getpid()))
            time.sleep(self.seconds)


def data(batch_size: int, shuffle: bool) -> hs.DataLoaders:
    """120 training and 51 validation samples of 8 features, 3 classes (51: shards of 26 and 25)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(171, 8, generator=gen), torch.randint(0, 3, (171,), generator=gen)
    loader_gen = torch.Generator().manual_seed(1)
    train = DataLoader(
        TensorDataset(x[:120], y[:120]), batch_size=batch_size, shuffle=shuffle, generator=loader_gen
    )
    valid = DataLoader(TensorDataset(x[120:], y[120:]), batch_size=batch_size)
    return hs.DataLoaders(train, valid)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--fault", choices=["nan", "raise", "kill", "inf-grad"])
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=3)
    parser.add_argument("--doctor", action="store_true")
    parser.add_argument("--guard", action="store_true")
    parser.add_argument("--checkpoints", type=Path)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--export", action="store_true", help="export_safetensors(model) at the end")
    parser.add_argument("--dcp", action="store_true", help="Checkpoint(sharded=True): through DCP")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pause-at", type=int)
    parser.add_argument("--pause-for", type=float, default=600)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2's fully_shard")
    parser.add_argument("--shard", action="store_true", help="Learner(shard=True): the Learner shards it")
    parser.add_argument("--accumulate", type=int, default=1, help="GradientAccumulation(n) when above 1")
    parser.add_argument("--bf16", action="store_true", help="MixedPrecision(torch.bfloat16)")
    parser.add_argument("--fp16", action="store_true", help="MixedPrecision(torch.float16): a grad scaler")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(16, 3))
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        torch.distributed.init_process_group("gloo")
        fully_shard(model)
    cbs: list[hs.Callback] = []
    if args.fault:
        cbs.append(Fault(args.fault, args.fault_rank, args.fault_step))
    if args.doctor:
        cbs.append(hs.callbacks.Doctor())
    if args.guard:
        cbs.append(hs.callbacks.NonFiniteGuard(quiet=True))
    if args.checkpoints:
        cbs.append(hs.callbacks.Checkpoint(args.checkpoints, every_n_steps=args.every, sharded=args.dcp))
    if args.accumulate > 1:
        cbs.append(hs.callbacks.GradientAccumulation(args.accumulate))
    if args.bf16 or args.fp16:
        cbs.append(hs.callbacks.MixedPrecision(torch.bfloat16 if args.bf16 else torch.float16))
    if args.pause_at is not None:
        cbs.append(PauseAt(args.pause_at, args.out, args.pause_for))
    learn = hs.Learner(
        model,
        data(args.batch_size, args.shuffle),
        nn.CrossEntropyLoss(),
        opt_func=torch.optim.SGD,
        lr=0.1,
        metrics=[hs.metrics.accuracy],
        cbs=cbs,
        progress=False,
        shard=args.shard,
    )
    seen: dict[str, int] = {}
    learn.add_cb(_Seen(seen))
    learn.add_cb(_CountReductions(seen))
    seen_dtype: list[torch.dtype] = []  # the first layer's weight as its forward sees it
    model[0].register_forward_pre_hook(lambda module, _: seen_dtype.insert(0, module.weight.dtype))
    learn.fit(args.epochs, resume="last" if args.resume else None)
    doctor = getattr(learn, "doctor", None)
    result = {
        "weights": _whole(learn.model.state_dict()),
        "sharded": distributed.is_sharded(learn.model),
        "param_dtype": str(seen_dtype[0]) if seen_dtype else None,
        "history": learn.recorder.history,
        "findings": [f.to_dict() for f in doctor.findings] if doctor is not None else [],
        "stats": _stats(doctor),
        "guard": _guard(learn),
        "precision": _precision(learn),
        **seen,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.export:
        checkpoint.export_safetensors(learn.model, args.out / "model.safetensors")
    torch.save(result, args.out / f"rank{int(os.environ.get('RANK', 0))}.pt")
    if args.fsdp:
        # this script made the process group, so it ends it as docs/distributed.md says: not left to the
        # interpreter's exit, where gloo's worker thread can free FSDP2's last all-gather after Python began
        # to finalize, and the rank aborts ("terminate called without an active exception")
        distributed.barrier()
        torch.distributed.destroy_process_group()


class _Seen(hs.Callback):
    """Records the world size and the number of training batches per epoch this rank saw."""

    def __init__(self, seen: dict[str, int]) -> None:
        self.seen = seen

    def before_train(self) -> None:
        self.seen.update(world=distributed.world_size(), n_iter=self.learn.n_iter)


class _CountReductions(hs.Callback):
    """Counts this rank's gradient reductions across ranks: DDP's bucket all-reduces (through a comm
    hook) or FSDP2's reduce-scatters."""

    def __init__(self, seen: dict[str, int]) -> None:
        self.seen = seen

    def before_fit(self) -> None:
        self.seen.update(reductions=0)
        ddp = self.learn.distributed.ddp
        if ddp is not None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counted_allreduce(state, bucket):  # DDP checks the names, and any annotation's type
                self.seen["reductions"] += 1
                return allreduce_hook(state, bucket)

            ddp.register_comm_hook(None, counted_allreduce)
        elif distributed.is_distributed():
            torch.distributed.reduce_scatter_single = self._counted(torch.distributed.reduce_scatter_single)

    def after_fit(self) -> None:
        self.seen.update(steps=self.learn.training_step)

    def _counted(self, reduce):
        def counted(*args, **kwargs):
            self.seen["reductions"] += 1
            return reduce(*args, **kwargs)

        return counted


def _whole(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state with every sharded tensor (an FSDP2 DTensor) gathered whole, for the comparison."""
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def _precision(learn: hs.Learner) -> dict[str, float] | None:
    """The float16 grad scaler's skipped steps and scale at the end; None without one."""
    mixed = next((cb for cb in learn.cbs if isinstance(cb, hs.callbacks.MixedPrecision)), None)
    if mixed is None or mixed.scaler is None:
        return None
    return {"skipped_steps": mixed.skipped_steps, "scale": float(mixed.scaler.get_scale())}


def _guard(learn: hs.Learner) -> dict[str, object] | None:
    """Where the NonFiniteGuard (alone or the Doctor's) stopped, and what it blamed; None when it did not."""
    doctor = getattr(learn, "doctor", None)
    guard = doctor.guard if doctor is not None else getattr(learn, "non_finite_guard", None)
    if guard is None or guard.stopped_at is None:
        return None
    return {"step": guard.stopped_at, "reason": guard.reason, "report": guard.report.to_dict()}


def _stats(doctor: object) -> dict[str, list[float]]:
    """The last activation statistics per layer: count, mean, std, abs-max, non-finite count."""
    if doctor is None:
        return {}
    latest = doctor.activations.latest()
    return {
        name: [r.stats.count, r.stats.mean, r.stats.std, r.stats.abs_max, r.stats.nonfinite]
        for name, r in latest.items()
    }


if __name__ == "__main__":
    main()
