"""Cost of ``Doctor()`` at its defaults next to the bare Learner, on the small CNN and on ResNet18.

Variants, run alternating in the same process (medians over rounds, and the median of per-round ratios):

- ``small CNN``: the model and data of ``stats_overhead.py`` (1x28x28, batch 64), a fit of
  ``--cnn-steps`` steps (default 300: three epochs of 100), bare, with ``Doctor()`` and, for reference,
  with ``Doctor(every=1)`` (statistics at every step, what the defaults were before);
- ``ResNet18``: torchvision's, weights=None, batches of ``--resnet-batch`` (default 8) 3x224x224 random
  images, ``--resnet-steps`` steps (default 100), bare and with ``Doctor()``;
- in both tables ``Doctor(guard=False)``: the Doctor without its non-finite guard, whose one host read per
  step is what a GPU pays for (docs/doctor.md#nonfiniteguard);
- ``--parts``: the small CNN's table without ``Doctor(every=1)``, with ``Doctor()`` less its protocol
  recorder, less its timing recorder, less both (the Doctor before the checks around the model and the
  timing), and the engine alone (less the guard too), as ``doctor_parts.doctor_without`` builds them.

The Doctor's defaults take the per-layer statistics on an adaptive schedule (every step of the first 5,
then every 50th, densely again while a check is suspicious) and keep the loss at every step, so its
cost depends on the fit's length: the table says how many steps were timed. AdamW(lr=1e-3), in-memory
tensors, CPU, one thread; an epoch ends with one validation batch. Target: ``Doctor()`` at most 1.05x.

Each table also gives every variant's page faults per step and the kernel's share of its CPU time, and
the paired ratio again over the rounds in which neither variant took more than 10 faults a step: glibc's
allocator drifts between fits into and out of a regime that faults every step, in either variant, and
such a round compares the allocator, not the code (``common.KernelMeter``).

A third table times one check of the engine (the rules every ``check_every`` = 20 steps) late in a long
run: an engine holding a synthetic loss history of 1,000 / 10,000 / 100,000 steps, fed 20 new losses per
check, as in training, over 200 checks (enough to include the stall rule's runs, every 64th of the run).

``--cuda``: the same tables on the GPU (the model and the in-memory data on ``cuda``, the wall clock,
the device synchronised before and after each fit), where the Doctor's host work can hide behind the
device's, unless a host sync waits for it.

``--compile``: instead, the small CNN compiled with ``torch.compile`` (inductor), bare and with
``Doctor()``: each variant's model is compiled once, in the warm-up, and reused by every round, so no
compilation is timed.

    python benchmarks/doctor_overhead.py --clock cpu   # full run (CPU time: steadier on a busy machine)
    python benchmarks/doctor_overhead.py --quick       # smoke test
    python benchmarks/doctor_overhead.py --compile     # Doctor() on a compiled model against it alone
    python benchmarks/doctor_overhead.py --cnn-only    # the small CNN's table alone
    python benchmarks/doctor_overhead.py --cnn-only --cnn-steps 3000  # a long fit: the warm-up amortised
    python benchmarks/doctor_overhead.py --cuda --resnet-batch 64      # on a GPU, a realistic batch
    python benchmarks/doctor_overhead.py --cnn-only --parts           # what each part of Doctor() costs
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from common import (
    CLOCKS,
    QUIET_FAULTS,
    KernelMeter,
    benchmark_args,
    format_table,
    median,
    paired_ratio,
    ratio_spread,
    run_alternating,
)
from doctor_parts import doctor_without, free_read_us
from stats_overhead import small_cnn
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs

TARGET = 1.05


def random_loaders(steps_per_epoch: int, batch: int, shape: tuple[int, ...]) -> tuple[DataLoader, DataLoader]:
    """In-memory random inputs of ``shape`` and labels of 10 classes, in order: ``steps_per_epoch``
    training batches and one validation batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps_per_epoch * batch, *shape, generator=gen)
    y = torch.randint(0, 10, (steps_per_epoch * batch,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch), DataLoader(
        TensorDataset(x[:batch], y[:batch]), batch_size=batch
    )


def fit(
    build: Callable[[], nn.Module],
    loaders: tuple[DataLoader, DataLoader],
    epochs: int,
    clock: Callable[[], float],
    doctor: dict | None,
    device: str = "cpu",
) -> float:
    """Seconds per training step of ``epochs`` epochs on ``device``, bare (``doctor=None``) or with
    ``Doctor(**doctor)``; on a GPU, from an idle device to the end of the fit's last kernel."""
    torch.manual_seed(0)
    cbs = [make_doctor(doctor)] if doctor is not None else []
    learn = hs.Learner(
        build(), loaders, nn.CrossEntropyLoss(), lr=1e-3, cbs=cbs, progress=False, device=device
    )
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    synchronize()
    start = clock()
    learn.fit(epochs)
    synchronize()
    return (clock() - start) / (epochs * len(loaders[0]))


def make_doctor(options: dict) -> hs.callbacks.Doctor:
    """``Doctor(quiet=True, **options)``; with ``options["without"]``, ``Doctor()`` less those parts
    (``doctor_parts.doctor_without``: "guard", "timing", "protocol")."""
    if "without" in options:
        return doctor_without(*options["without"])
    return hs.callbacks.Doctor(quiet=True, **options)


PARTS_LEFT_OUT = {
    "+ Doctor() without protocol": ("protocol",),
    "+ Doctor() without timing": ("timing",),
    "+ Doctor() without protocol, timing": ("protocol", "timing"),
    "+ engine alone": ("protocol", "timing", "guard"),
}


def resnet18() -> nn.Module:
    from torchvision.models import resnet18 as build

    return build(weights=None, num_classes=10)


def compiled(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """A builder returning one ``torch.compile``d model, the same at every call: it is compiled at its
    first fit (the warm-up) and every timed round reuses its graphs."""
    model = torch.compile(build())
    return lambda: model


def measure(
    title: str,
    variants: dict[str, Callable[[], float]],
    rounds: int,
    steps: int,
    warmup: list[Callable[[], float]] | None = None,
) -> dict[str, float]:
    """Warm up (each variant once, or the shorter ``warmup`` runs), time the variants alternating and
    print the table, with each variant's page faults and kernel time (``steps`` per fit); returns the
    paired ratios."""
    for run in warmup if warmup is not None else variants.values():
        run()
    meter = KernelMeter()
    times = run_alternating(meter.wrap(variants), rounds)
    bare = "hookscope Learner"
    print(format_table(title, {n: median(t) * 1e6 for n, t in times.items()}, bare))
    ratios = {}
    for name in list(variants)[1:]:
        ratios[name] = paired_ratio(times, name, bare)
        print(
            f"  {name} vs bare, median of per-round ratios: {ratios[name]:.3f}x (target <= {TARGET}x; "
            f"{ratio_spread(times, name, bare)})"
        )
    print(meter.report(steps))
    for name in list(variants)[1:]:
        quiet = meter.quiet_rounds([bare, name], steps)
        matched = {n: [times[n][r] for r in quiet] for n in (bare, name)}
        ratio = f"{paired_ratio(matched, name, bare):.3f}x" if quiet else "no such round"
        print(
            f"  {name} vs bare in the {len(quiet)} of {rounds} rounds where neither took over "
            f"{QUIET_FAULTS} page faults a step: {ratio}"
        )
    return ratios


def check_cost(lengths: tuple[int, ...], checks: int, clock: Callable[[], float]) -> None:
    """Print the time of one engine check at each loss-history length (``CHECK_EVERY`` new losses per
    check)."""
    from hookscope.doctor.engine import CHECK_EVERY, Engine

    new = CHECK_EVERY
    print(f"One Doctor check late in a run ({new} new losses per check, {checks} checks, {clock.__name__}):")
    gen = torch.Generator().manual_seed(0)
    for n in lengths:
        engine = Engine(every=None, quiet=True)
        engine.attach(nn.Sequential(nn.Linear(4, 4)))
        noise = torch.rand(n + new * checks, generator=gen).tolist()
        engine.record_losses((i, 2.0 * 0.99995**i + 0.1 * noise[i]) for i in range(n))
        engine.check()
        start = clock()
        for c in range(checks):
            engine.record_losses((i, 1.0 + 0.1 * noise[i]) for i in range(n + new * c, n + new * (c + 1)))
            engine.check()
        per_check = (clock() - start) / checks
        per_step = per_check / new
        print(f"  at step {n:>7,}: {per_check * 1e3:7.3f} ms per check, {per_step * 1e6:6.2f} us per step")


def doctor_variants(run: Callable[[dict | None], float]) -> dict[str, Callable[[], float]]:
    """The bare Learner, ``Doctor()`` and ``Doctor(guard=False)`` of one fit ``run(doctor)``."""
    return {
        "hookscope Learner": partial(run, None),
        "+ Doctor()": partial(run, {}),
        "+ Doctor(guard=False)": partial(run, {"guard": False}),
    }


def main() -> None:
    args = benchmark_args(
        __doc__.splitlines()[0],
        {
            "--compile": "the small CNN compiled, bare and with Doctor()",
            "--cnn-only": "the small CNN alone (ResNet18 takes ~4 minutes a round)",
            "--cuda": "on the GPU (the wall clock, synchronised at each fit's ends)",
            "--parts": "the small CNN with Doctor() less its protocol, timing, both, and all but its engine",
        },
        {
            "--cnn-steps": (300, "training steps of a small-CNN fit, in three epochs when divisible by 3"),
            "--resnet-steps": (100, "training steps of a ResNet18 fit"),
            "--resnet-batch": (8, "images per ResNet18 batch"),
        },
    )
    if min(args.cnn_steps, args.resnet_steps, args.resnet_batch) < 1:
        raise SystemExit(
            f"doctor_overhead.py: --cnn-steps {args.cnn_steps}, --resnet-steps {args.resnet_steps}, "
            f"--resnet-batch {args.resnet_batch}; use 1 or more"
        )
    if args.cuda and not torch.cuda.is_available():
        raise SystemExit("doctor_overhead.py --cuda: no CUDA device is available here; leave out --cuda")
    if args.cuda and args.clock == "cpu":
        raise SystemExit(
            "doctor_overhead.py --cuda --clock cpu: the GPU's time is not this thread's; use --clock wall"
        )
    device, where = ("cuda", f"GPU ({torch.cuda.get_device_name()})") if args.cuda else ("cpu", "1 thread")
    cnn_steps, resnet_steps, rounds = (
        (20, 4, 1) if args.quick else (args.cnn_steps, args.resnet_steps, args.rounds)
    )
    clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    cnn_epochs = 3 if cnn_steps % 3 == 0 else 1
    if args.compile:
        loaders = random_loaders(cnn_steps // cnn_epochs, 64, (1, 28, 28))
        bare, doctored = compiled(small_cnn), compiled(small_cnn)  # one model each: its own graphs
        measure(
            f"Doctor() on a compiled model: small CNN 1x28x28, batch 64, {cnn_steps} steps x {rounds} "
            f"rounds, torch.compile (inductor), 1 thread, {args.clock} clock",
            {
                "hookscope Learner": partial(fit, bare, loaders, cnn_epochs, clock, None),
                "+ Doctor()": partial(fit, doctored, loaders, cnn_epochs, clock, {}),
            },
            rounds,
            cnn_steps,
        )
        return
    cnn_loaders = random_loaders(cnn_steps // cnn_epochs, 64, (1, 28, 28))
    cnn = partial(fit, small_cnn, cnn_loaders, cnn_epochs, clock, device=device)
    walk_before = free_read_us()
    variants = doctor_variants(cnn)
    if args.parts:
        variants.update({name: partial(cnn, {"without": parts}) for name, parts in PARTS_LEFT_OUT.items()})
    else:
        variants["+ Doctor(every=1)"] = partial(cnn, {"every": 1})
    measure(
        f"Doctor() overhead: small CNN 1x28x28, batch 64, {cnn_steps} steps x {rounds} rounds, {where}, "
        f"{args.clock} clock",
        variants,
        rounds,
        cnn_steps,
    )
    if not args.cuda:
        print(
            f"  the CPU memory probe's heap walk (one mallinfo2 read): {walk_before:.1f} µs before the "
            f"rounds, {free_read_us():.1f} µs after (malloc's free lists lengthen with every fit)"
        )
    if args.cnn_only:
        return
    batch = args.resnet_batch
    resnet = partial(
        fit, resnet18, random_loaders(resnet_steps, batch, (3, 224, 224)), 1, clock, device=device
    )
    warm = partial(fit, resnet18, random_loaders(2, batch, (3, 224, 224)), 1, clock, device=device)
    measure(
        f"Doctor() overhead: ResNet18 3x224x224, batch {batch}, {resnet_steps} steps x {rounds} rounds, "
        f"{where}, {args.clock} clock",
        doctor_variants(resnet),
        rounds,
        resnet_steps,
        warmup=[partial(warm, None), partial(warm, {}), partial(warm, {"guard": False})],  # a step is slow
    )
    check_cost((1_000, 10_000, 100_000), 5 if args.quick else 200, clock)


if __name__ == "__main__":
    main()
