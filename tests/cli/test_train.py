"""The train job's options: which callbacks they turn into, and what config.json records."""

import json

import torch

from hookscope.callbacks import (
    Checkpoint,
    Doctor,
    GradientClip,
    MetricsLogger,
    MixedPrecision,
    OneCycle,
    RunFolder,
)
from hookscope.cli.options import DEFAULTS, OPTION_NAMES, TrainOptions
from hookscope.cli.train import build_learner, train_callbacks


def test_defaults_are_the_demo():
    assert (DEFAULTS.model, DEFAULTS.data, DEFAULTS.epochs, DEFAULTS.doctor) == (
        "hookscope.models:digits_cnn",
        "digits",
        5,
        True,
    )


def test_default_callbacks(tmp_path):
    cbs = train_callbacks(TrainOptions(), tmp_path / "run")
    assert [type(cb) for cb in cbs] == [OneCycle, Doctor, RunFolder]
    assert [type(cb) for cb in cbs[-1].companions] == [MetricsLogger, Checkpoint]
    checkpoint = cbs[-1].checkpoint
    assert checkpoint.dir == tmp_path / ".run.partial" / "checkpoints" and checkpoint.monitor == "valid_loss"


def test_precision_clip_and_no_doctor_become_callbacks(tmp_path):
    options = TrainOptions(precision="bf16", clip=0.5, doctor=False)
    cbs = train_callbacks(options, tmp_path / "run")
    precision = next(cb for cb in cbs if isinstance(cb, MixedPrecision))
    clip = next(cb for cb in cbs if isinstance(cb, GradientClip))
    assert precision.requested_dtype == torch.bfloat16 and clip.max_norm == 0.5
    assert not any(isinstance(cb, Doctor) for cb in cbs)


def test_config_records_every_option_the_command_and_versions(tmp_path):
    options = TrainOptions(lr=0.01, epochs=1)
    learn = build_learner(options, tmp_path / "run", command="hookscope train --lr 0.01")
    learn.cbs = [cb for cb in learn.cbs if not isinstance(cb, Doctor)]  # the config, not the statistics
    learn.run_folder.figures = False
    learn.fit(1)
    assert learn.run_folder.publish() == tmp_path / "run"  # the command publishes after its closing words
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(config["options"]) == set(OPTION_NAMES)
    assert config["options"]["lr"] == 0.01 and config["command"] == "hookscope train --lr 0.01"
    assert config["versions"]["torch"] == torch.__version__ and config["name"] == "run"
