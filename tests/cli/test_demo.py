"""The train job's options: which callbacks they turn into, and what config.json records."""

import json

import torch

from hookscope.callbacks import Checkpoint, Doctor, GradientClip, MetricsLogger, MixedPrecision, OneCycle
from hookscope.demo import DEFAULTS, OPTION_NAMES, TrainOptions, train_callbacks, write_config
from hookscope.run_folder import RunFolder


def test_defaults_are_the_demo():
    assert (DEFAULTS.model, DEFAULTS.data, DEFAULTS.epochs, DEFAULTS.doctor) == (
        "hookscope.models:digits_cnn",
        "digits",
        5,
        True,
    )


def test_default_callbacks(tmp_path):
    cbs = train_callbacks(TrainOptions(), RunFolder.start(tmp_path / "run"))
    assert [type(cb) for cb in cbs] == [OneCycle, MetricsLogger, Checkpoint, Doctor]
    checkpoint = cbs[2]
    assert checkpoint.dir == tmp_path / ".run.partial" / "checkpoints" and checkpoint.monitor == "valid_loss"


def test_precision_clip_and_no_doctor_become_callbacks(tmp_path):
    options = TrainOptions(precision="bf16", clip=0.5, doctor=False)
    cbs = train_callbacks(options, RunFolder.start(tmp_path / "run"))
    precision = next(cb for cb in cbs if isinstance(cb, MixedPrecision))
    clip = next(cb for cb in cbs if isinstance(cb, GradientClip))
    assert precision.requested_dtype == torch.bfloat16 and clip.max_norm == 0.5
    assert not any(isinstance(cb, Doctor) for cb in cbs)


def test_config_records_every_option_the_command_and_versions(tmp_path):
    folder = RunFolder.start(tmp_path / "run")
    write_config(folder, TrainOptions(lr=0.01), "hookscope train --lr 0.01", status="running")
    config = json.loads((folder.path / "config.json").read_text())
    assert set(config["options"]) == set(OPTION_NAMES)
    assert config["options"]["lr"] == 0.01 and config["command"] == "hookscope train --lr 0.01"
    assert config["versions"]["torch"] == torch.__version__ and config["name"] == "run"
