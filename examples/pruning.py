"""Pruning through hooks (article 003's last paragraph), and asking each layer whether it matters.

Two models on scikit-learn's digits: the digits CNN (8x8) and a ResNet18 (weights=None, trained briefly on
the digits upscaled to 32x32). Each is pruned to 50% and 80% of its channels with every importance of
``hs.prune`` — magnitude (l1), random, mean |activation| and first-order Taylor, the last two measured
through hooks on one training batch — compacted (pruned channels removed with Torch-Pruning, where MACs and
latency drop) and fine-tuned briefly. The channels pruned are those of BatchNorm layers whose zeros reach
the next convolution unchanged (every BatchNorm of the digits CNN; the first BatchNorm of each ResNet basic
block, whose channels no residual addition couples), so compacting changes no output: the example checks
it. The digits CNN is also pruned unstructured (single weights of every conv and linear layer), and its
layers and the units of its last conv block are ablated.

    python examples/pruning.py [--out pruning_out]

Writes ``results.md`` (the tables of docs/pruning.md), ``ablation_layers.png`` and ``ablation_units.png``
into ``--out``. Latency is the median CPU time of one forward of a 64-image batch on one thread (a CPU
clock stays steady while other processes load the machine).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models import resnet18

import hookscope as hs
from hookscope.data.digits import digits_loaders
from hookscope.hooks.ablate import Ablation
from hookscope.models import digits_cnn
from hookscope.train.events import CancelFitException

HOWS = ("l1", "random", "activation", "taylor")
AMOUNTS = (0.5, 0.8)
TUNE_BATCHES = 20  # the short fine-tune after pruning
START = [time.perf_counter()]


def small_resnet18() -> nn.Module:
    """ResNet18 (random init) for one-channel 32x32 digits: a one-channel stem, ten classes."""
    model = resnet18(weights=None, num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def learner(model: nn.Module, size: int) -> hs.Learner:
    train, valid = digits_loaders(batch_size=64, size=size)
    return hs.Learner(
        model, (train, valid), F.cross_entropy, lr=3e-3, metrics=[hs.metrics.accuracy], progress=False
    )


def accuracy(learn: hs.Learner) -> float:
    return learn.validate()["accuracy"]


def latency_ms(model: nn.Module, x: torch.Tensor, rounds: int = 15) -> float:
    """Median CPU milliseconds of one forward of ``x`` on one thread, in eval mode, after two warm-ups."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.eval()
    times = []
    try:
        with torch.no_grad():
            for i in range(rounds + 2):
                start = time.process_time()
                model(x)
                if i >= 2:
                    times.append(1000 * (time.process_time() - start))
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


class StopAfter(hs.Callback):
    """End the fit after ``n`` training batches: a short fine-tune."""

    def __init__(self, n: int) -> None:
        self.n = n

    def after_batch(self) -> None:
        if self.learn.training and self.learn.train_iter >= self.n:
            raise CancelFitException()


def finetune(learn: hs.Learner) -> float:
    learn.opt = None  # a fresh optimizer: the compacted model has new parameters
    learn.fit(1, lr=1e-3, cbs=[StopAfter(TUNE_BATCHES)])
    return accuracy(learn)


def prune_row(
    base: nn.Module, size: int, spec: Any, how: str, amount: float, structured: bool
) -> dict[str, Any]:
    """One table row: prune a copy of ``base``, measure, compact (structured), fine-tune, measure."""
    model = copy.deepcopy(base)
    learn = learner(model, size)
    x = next(iter(learn.dls.valid))[0]
    torch.manual_seed(0)  # the random importance's draw
    data = [learn.one_batch()]  # activation and Taylor: one training batch, through hooks
    table = hs.prune(model, spec, amount, how, structured=structured, data=data, loss_func=F.cross_entropy)
    row = {"how": how, "amount": f"{amount:.0%}", "sparsity": table.total, "after": accuracy(learn)}
    if structured:
        report = hs.compact(model, x[:1])
        row["compacted"] = accuracy(learn)
        if abs(row["compacted"] - row["after"]) > 1e-6:
            raise AssertionError(f"compact changed the accuracy: {row['after']} -> {row['compacted']}")
        row.update(macs=report.macs_after, params=report.params_after, latency_ms=latency_ms(model, x))
    row["fine-tuned"] = finetune(learn)
    return row


def train(build: Callable[[], nn.Module], size: int, epochs: int) -> tuple[nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    learn = learner(build(), size)
    learn.fit_one_cycle(epochs, lr_max=3e-3)
    x = next(iter(learn.dls.valid))[0]
    summary = hs.summary(learn.model, x[:1])
    dense = {
        "accuracy": accuracy(learn),
        "macs": summary.total_macs,
        "params": summary.total_params,
        "latency_ms": latency_ms(learn.model, x),
    }
    return learn.model, dense


def rows(base: nn.Module, size: int, spec: Any, structured: bool, name: str) -> list[dict[str, Any]]:
    found = []
    for amount in AMOUNTS:
        for how in HOWS:
            found.append(prune_row(base, size, spec, how, amount, structured))
            progress(f"{name}: {how} {amount:.0%}")
    return found


def progress(what: str) -> None:
    """Wall-clock and CPU seconds since the start: the CPU time says what an unloaded machine would take."""
    print(
        f"[{time.perf_counter() - START[0]:6.1f} s wall, {time.process_time():6.1f} s CPU] {what}", flush=True
    )


def structured_table(title: str, dense: dict[str, Any], found: list[dict[str, Any]]) -> str:
    lines = [
        f"**{title}**, dense: accuracy {dense['accuracy']:.3f}, {dense['macs']:,} MACs per image, "
        f"{dense['params']:,} params, {dense['latency_ms']:.1f} ms CPU per 64-image batch",
        "",
        "| how | channels pruned | acc. after pruning | after compact | after fine-tune | MACs | params "
        "| latency (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        lines.append(
            f"| {r['how']} | {r['amount']} | {r['after']:.3f} | {r['compacted']:.3f} | "
            f"{r['fine-tuned']:.3f} | {r['macs']:,} ({r['macs'] / dense['macs']:.0%}) | {r['params']:,} | "
            f"{r['latency_ms']:.1f} |"
        )
    return "\n".join(lines)


def unstructured_table(title: str, dense: dict[str, Any], found: list[dict[str, Any]]) -> str:
    lines = [
        f"**{title}**, dense: accuracy {dense['accuracy']:.3f}",
        "",
        "| how | weights pruned | acc. after pruning | after fine-tune |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['how']} | {r['amount']} | {r['after']:.3f} | {r['fine-tuned']:.3f} |" for r in found]
    return "\n".join(lines)


def ablations(model: nn.Module, out: Path) -> tuple[str, Ablation]:
    """Layer ablations (zero and mean, accuracy) and per-unit zero ablation (cross-entropy) of the last conv
    block's BatchNorm."""
    valid = learner(model, 8).dls.valid
    layers = (nn.Conv2d, nn.BatchNorm2d, nn.Linear)
    zero = hs.ablate(model, layers, valid, metric=hs.metrics.accuracy)
    mean = hs.ablate(model, layers, valid, metric=hs.metrics.accuracy, how="mean")
    units = hs.ablate(model, "features.3.1", valid, per="unit")  # the loss: one unit moves accuracy little
    hs.viz.save_figure(hs.viz.ablation_effects(mean), out / "ablation_layers.png")
    hs.viz.save_figure(hs.viz.ablation_effects(units, top=20), out / "ablation_units.png")
    by_name = {row.name: row for row in mean.rows}
    lines = [
        f"Digits CNN ablations, validation accuracy {zero.baseline:.3f} intact:",
        "",
        "| layer | zero ablation | mean ablation |",
        "|---|---|---|",
    ]
    lines += [f"| {r.name} | {r.effect:+.3f} | {by_name[r.name].effect:+.3f} |" for r in zero.rows]
    return "\n".join(lines), units


def main(out: Path = Path("pruning_out")) -> dict[str, Any]:
    """Run every experiment; write ``results.md`` and the figures into ``out``; return the numbers."""
    out.mkdir(parents=True, exist_ok=True)
    START[0] = time.perf_counter()
    cnn, cnn_dense = train(digits_cnn, 8, epochs=3)
    cnn_rows = rows(cnn, 8, nn.BatchNorm2d, structured=True, name="digits CNN channels")
    weight_rows = rows(cnn, 8, (nn.Conv2d, nn.Linear), structured=False, name="digits CNN weights")
    resnet, resnet_dense = train(small_resnet18, 32, epochs=2)
    progress("ResNet18 trained")
    resnet_rows = rows(resnet, 32, "layer*.*.bn1", structured=True, name="ResNet18 channels")
    ablation_text, units = ablations(cnn, out)
    text = "\n\n".join(
        [
            structured_table("Digits CNN (8x8), channels of every BatchNorm", cnn_dense, cnn_rows),
            unstructured_table(
                "Digits CNN (8x8), single weights of every conv and linear", cnn_dense, weight_rows
            ),
            structured_table("ResNet18 (32x32), channels inside each basic block", resnet_dense, resnet_rows),
            ablation_text,
        ]
    )
    (out / "results.md").write_text(text + "\n")
    print(text)
    print("\n" + "\n".join(str(units).splitlines()[:12]))  # the units whose loss costs most
    progress(f"done; tables and figures in {out}")
    return {"digits_cnn": (cnn_dense, cnn_rows, weight_rows), "resnet18": (resnet_dense, resnet_rows)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("pruning_out"))
    main(parser.parse_args().out)
