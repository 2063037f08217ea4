"""Cost of the loop-protocol checks (:class:`hookscope.doctor.protocol.ProtocolRecorder`) per training step.

A plain loop trains the small CNN of ``stats_overhead.py`` with a BatchNorm after each conv and a dropout
before the head (so the mode checks have modules to read): 1x28x28 random images, batch 64, AdamW, CPU,
one thread, 300 steps. Bare, and with the recorder fed as ``hs.watch`` feeds the engine: the
optimizer's step pre/post hooks (gradients ready, step done, end of batch, next batch), the loss and
the targets logged every step, the checks every 20 steps (the engine's ``CHECK_EVERY``). Variants
alternate over rounds; the table gives the median per-step time and the median of per-round ratios.
Target: under 1.01x.

The recorder's few tens of microseconds are below the noise of a CNN step on a busy machine, so a second
table times the same loop on the same inputs with a model that costs almost nothing (a linear layer on a
64-value crop, 2,000 steps): the difference per step is the recorder's own cost, which the first table's
CNN step then puts in proportion.

    python benchmarks/protocol_overhead.py --clock cpu   # full run (CPU time: steadier on a busy machine)
    python benchmarks/protocol_overhead.py --quick       # smoke test
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from common import (
    CLOCKS,
    benchmark_args,
    feed_from_optimizer,
    format_table,
    median,
    paired_ratio,
    run_alternating,
)
from torch import nn

from hookscope.doctor.protocol import ProtocolRecorder

BATCH = 64


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(32 * 7 * 7, 10),
    )


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, 1, 28, 28, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
        for _ in range(n)
    ]


class Tiny(nn.Module):
    """Almost no compute: a linear layer on the first 64 pixels (the recorder sees the whole input)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(x.flatten(1)[:, :64]))


def train(
    build: Callable[[], nn.Module], data: list, steps: int, clock: Callable[[], float], protocol: bool
) -> float:
    """Seconds per step of a plain loop, bare or feeding a ProtocolRecorder."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = ProtocolRecorder(total_steps=steps) if protocol else None
    if recorder is not None:
        recorder.attach(model)
        recorder.watch_optimizer(opt)
        feed_from_optimizer(recorder, opt)
    loss_fn = nn.CrossEntropyLoss()
    start = clock()
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if recorder is not None:
            recorder.log_loss(loss, training=True)
            recorder.log_target(y)
        loss.backward()
        opt.step()
    if recorder is not None:
        recorder.close()
        assert recorder.findings() == [], "the benchmark's loop is healthy"
    return (clock() - start) / steps


def main() -> None:
    args = benchmark_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    rounds = 1 if args.quick else args.rounds
    data = batches(50)
    cnn_us = _table("small CNN + BN + dropout", cnn, data, 20 if args.quick else 300, rounds, args.clock)
    tiny_us = _table(
        "near-empty model, same inputs", Tiny, data, 50 if args.quick else 2000, rounds, args.clock
    )
    extra = tiny_us[1] - tiny_us[0]
    print(f"the recorder's own cost: {extra:.1f} µs per step = {extra / cnn_us[0]:.2%} of a small CNN step")


def _table(
    name: str, build: Callable[[], nn.Module], data: list, steps: int, rounds: int, clock: str
) -> tuple:
    variants = {
        "plain loop": lambda: train(build, data, steps, CLOCKS[clock], protocol=False),
        "+ ProtocolRecorder": lambda: train(build, data, steps, CLOCKS[clock], protocol=True),
    }
    times = run_alternating(variants, rounds)
    per_step = {variant: median(values) * 1e6 for variant, values in times.items()}
    print(
        format_table(
            f"{name}, batch {BATCH}, {steps} steps, {rounds} rounds, {clock} clock", per_step, "plain loop"
        )
    )
    print(f"  median paired ratio {paired_ratio(times, '+ ProtocolRecorder', 'plain loop'):.4f}x")
    return per_step["plain loop"], per_step["+ ProtocolRecorder"]


if __name__ == "__main__":
    main()
