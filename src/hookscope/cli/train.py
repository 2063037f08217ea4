"""``hookscope train``: a Learner with the :class:`~hookscope.callbacks.RunFolder` callback, built from the
command's options — what ``make demo`` runs.

With the defaults it trains :func:`hookscope.models.digits_cnn` on scikit-learn's bundled digits with a
one-cycle schedule and the doctor on, in well under a minute on a laptop CPU. Everything the run folder
holds is written by the callback; this module only turns options into a Learner and reports the result.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import torch
from torch import nn

from hookscope.callbacks.clip import GradientClip
from hookscope.callbacks.doctor import Doctor
from hookscope.callbacks.precision import MixedPrecision
from hookscope.callbacks.run_folder import RunFolder
from hookscope.callbacks.schedule import OneCycle
from hookscope.callbacks.trackers.mlflow import MLflowCallback
from hookscope.callbacks.trackers.tensorboard import TensorBoardCallback
from hookscope.callbacks.trackers.wandb import WandbCallback
from hookscope.cli.common import USAGE_ERROR, CommandError, _explain, _short_name
from hookscope.cli.options import OPTION_NAMES, TrainOptions, tracker_names
from hookscope.doctor.findings import Finding, ranked
from hookscope.doctor.preflight import preflight
from hookscope.metrics import accuracy
from hookscope.specs import SpecError, checked_summary, load_data, load_model
from hookscope.staged_folder import CONFIG, StagedFolder, read_json
from hookscope.train import distributed
from hookscope.train.callback import Callback
from hookscope.train.learner import Learner
from hookscope.viz.report import REPORT


def run(args: argparse.Namespace) -> int:
    """Train as the arguments say. The run folder replaces ``--out`` only when everything succeeded —
    training, the report, the closing message, and no error among the doctor's findings."""
    given = {k: getattr(args, k) for k in OPTION_NAMES if getattr(args, k, None) is not None}
    if args.no_doctor:
        given["doctor"] = False
    if args.no_doctor and args.profile:
        raise CommandError("--profile names slow layers through the doctor: drop --no-doctor", USAGE_ERROR)
    if args.resume_from and not args.resume:
        raise CommandError("--resume-from FILE needs --resume RUN_DIR (the run to continue)", USAGE_ERROR)
    if args.allow_other_run and not args.resume:
        raise CommandError(
            "--allow-other-run continues another run's checkpoint: it needs --resume RUN_DIR "
            "(and --resume-from FILE); to start from another run's weights use --weights",
            USAGE_ERROR,
        )
    if args.resume:
        options, out = _resumed(args.resume, given), args.resume
    else:
        options = TrainOptions(**given)
        out = args.out or f"runs/{_short_name(options.model)}-{datetime.now():%Y%m%d-%H%M%S}"
    # Before any data loads: a live writer of the run is refused (also with --overwrite) and the folder
    # checked; the lock then passes to the RunFolder, which holds it until the run is published.
    claim = StagedFolder.lock_for(out)
    try:
        if distributed.is_rank_zero():  # under torchrun rank 0 writes the run folder
            StagedFolder.acquire(claim)
        if not args.resume:
            StagedFolder.check_start(out, "train", overwrite=args.overwrite, lock=claim)
        options.out = str(StagedFolder.paths(out)[0])
        learn = build_learner(
            options,
            out,
            command=args.command_line,
            resume=bool(args.resume),
            allow_other_run=args.allow_other_run,
        )
        learn.run_folder.lock.take_over(claim)
    finally:
        claim.release()
    folder = learn.run_folder
    folder.overwrite = args.overwrite
    if options.preflight and not args.resume and distributed.is_rank_zero():
        folder.preflight = run_preflight(learn)
    start = time.perf_counter()
    try:
        learn.fit(options.epochs, resume=(args.resume_from or out) if args.resume else None)
    except KeyboardInterrupt:
        folder.lock.release()  # also when the fit stopped before its callbacks ran (a resume refused)
        if distributed.is_rank_zero():
            print(f"hookscope train: interrupted{_resume_hint(folder)}", file=sys.stderr)
        return 130
    except Exception as err:
        folder.lock.release()
        code, message = _explain(err)
        raise CommandError(message + _resume_hint(folder), code) from err
    findings = ranked(learn.doctor.findings) if options.doctor else None
    errors = [f for f in [*(folder.preflight or ()), *(findings or ())] if f.severity == "error"]
    if not distributed.is_rank_zero():  # under torchrun rank 0 reports and publishes the run folder
        return 1 if errors else 0
    report_dir = folder.path if errors else folder.final
    print(closing_words(learn, report_dir, time.perf_counter() - start, findings))
    if errors:
        reason = f"the doctor found {len(errors)} error(s): {errors[0].message}"
        folder.mark_failed(reason)
        raise CommandError(
            f"{reason}; the run is kept unfinished in {folder.path} and {folder.final} is untouched; "
            "see the findings above and report.html, fix the cause and train again (--overwrite starts over)"
        )
    folder.publish()
    return 0


def build_learner(
    options: TrainOptions,
    path: str | Path,
    command: str = "",
    resume: bool = False,
    allow_other_run: bool = False,
) -> Learner:
    """The Learner ``options`` describe, writing its run folder to ``path`` (``resume``: its weights come
    from the run's checkpoint, not ``--weights``; ``allow_other_run``: that checkpoint may be another
    run's, ``--allow-other-run``).

    Model, data and input problems raise :class:`~hookscope.specs.SpecError` before anything is written.
    """
    torch.manual_seed(options.seed)
    device = _device(options)
    data = load_data(
        options.data, batch_size=options.batch_size, seed=options.seed, image_size=options.image_size
    )
    # resuming, the weights come from the run's checkpoint: neither --weights nor the random-weights note
    weights = None if resume else options.weights
    model = load_model(options.model, num_classes=data.num_classes, weights=weights, quiet=resume)
    sample = next(iter(data.valid))[0][:1]
    fix = f"use --data whose samples fit {options.model}, or a --model built for them"
    checked_summary(model, options.model, fix, example=sample, num_classes=data.num_classes)
    return Learner(
        model,
        (data.train, data.valid),
        nn.CrossEntropyLoss(),
        lr=options.lr,
        metrics=[accuracy],
        cbs=train_callbacks(options, path, command, allow_other_run=allow_other_run),
        device=device,
    )


def train_callbacks(
    options: TrainOptions, path: str | Path, command: str = "", allow_other_run: bool = False
) -> list[Callback]:
    """The callbacks ``options`` ask for: one-cycle, precision, clipping, the doctor, the trackers of
    ``--log``, and the run folder (metrics, checkpoints with the best by validation loss, figures, report;
    ``allow_other_run``: a resume may continue another run's checkpoint)."""
    cbs: list[Callback] = [OneCycle(options.lr)]
    if options.precision != "32":
        cbs.append(MixedPrecision(torch.bfloat16 if options.precision == "bf16" else torch.float16))
    if options.clip is not None:
        cbs.append(GradientClip(options.clip))
    if options.doctor:
        cbs.append(Doctor(profile=options.profile))
    trackers = {"tensorboard": TensorBoardCallback, "wandb": WandbCallback, "mlflow": MLflowCallback}
    cbs += [trackers[name]() for name in tracker_names(options.log)]
    checkpoints = {"monitor": "valid_loss", "sigint": True, "allow_other_run": allow_other_run}
    cbs.append(
        RunFolder(path, config=asdict(options), command=command, checkpoints=checkpoints, publish=False)
    )
    return cbs


def run_preflight(learn: Learner) -> list[Finding]:
    """:func:`hookscope.preflight` on the Learner's model, training data and loss (overfitting one batch
    with its optimizer and learning rate), before any training; prints what it found."""
    findings = ranked(
        preflight(learn.model, learn.dls, learn.loss_func, opt_func=learn.opt_func, lr=learn.lr)
    )
    if not findings:
        print("preflight: every check passed")
    else:
        print(f"preflight found {len(findings)} problem(s) before training:")
    for f in findings:
        print(f"  [{f.severity}] {f.kind} {f.module or '(model)'}: {f.message}")
    return findings


def closing_words(learn: Learner, path: Path, seconds: float, findings: list[Finding] | None) -> str:
    """What ``hookscope train`` prints at the end: the report's path, the final metrics, and the top
    ``findings`` (most severe first; None: the doctor was off)."""
    lines = [f"report: {path / REPORT}"]
    history = learn.recorder.history
    if history:
        last = history[-1]
        lines.append(
            f"epoch {last['epoch'] + 1}: valid_loss {last['valid_loss']:.4f}, "
            f"accuracy {last['accuracy']:.4f} ({seconds:.1f} s)"
        )
    if findings is None:
        return "\n".join([*lines, "doctor: off (--no-doctor)"])
    if not findings:
        return "\n".join([*lines, "doctor: no problem found"])
    lines.append("top findings:")
    lines += [f"  [{f.severity}] {f.module or '(model)'}: {f.message}" for f in findings[:3]]
    return "\n".join(lines)


def _device(options: TrainOptions) -> torch.device:
    """The device ``--device`` names (default cuda when available); a SpecError for one that is not here."""
    try:
        device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as err:
        raise SpecError(
            f"--device {options.device}: not a torch device name; use cpu, cuda or cuda:0"
        ) from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"--device {options.device}: no CUDA device is available here; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SpecError(
            f"--device {options.device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
            "use --device cuda:0"
        )
    if options.precision == "fp16" and device.type != "cuda":
        raise SpecError("--precision fp16 needs a CUDA device (it uses a gradient scaler); use bf16 on CPU")
    return device


def _resume_hint(folder: RunFolder) -> str:
    """Where the unfinished run is, and the command that continues it (when a checkpoint was saved)."""
    if not (folder.path / "checkpoints" / "last.pt").is_file():
        return f"; the unfinished run is kept in {folder.path}" if (folder.path / CONFIG).is_file() else ""
    return f"; the unfinished run is kept: hookscope train --resume {folder.path}"


def _resumed(run_dir: str, given: dict[str, object]) -> TrainOptions:
    """The options of the run in ``run_dir``; only ``--epochs`` and ``--device`` may change."""
    changed = sorted(set(given) - {"epochs", "device"})
    if changed:
        raise CommandError(
            f"--resume continues {run_dir} with its own options; {', '.join(map(_flag, changed))} "
            "cannot change (only --epochs and --device can)",
            USAGE_ERROR,
        )
    StagedFolder.check_run(run_dir)
    saved = read_json(Path(run_dir) / CONFIG)["options"]
    options = TrainOptions(**{k: v for k, v in saved.items() if k in OPTION_NAMES})
    for key, value in given.items():
        setattr(options, key, value)
    return options


def _flag(option: str) -> str:
    """The command-line flag of a TrainOptions field: ``batch_size`` -> ``--batch-size``."""
    return "--no-doctor" if option == "doctor" else "--" + option.replace("_", "-")
