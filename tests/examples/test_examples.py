import importlib.util
import math
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_count_params_prints_the_parameter_count_before_training(capsys):
    learn = _load("count_params").main()
    assert capsys.readouterr().out.splitlines()[0] == "Num param: 2"
    history = learn.recorder.history
    assert len(history) == 2 and history[1]["valid_loss"] < history[0]["valid_loss"]


def test_two_layer_net_loss_falls_at_least_100_times():
    learn = _load("two_layer_net").main()
    losses = learn.recorder.losses
    assert len(losses) == 500
    assert losses[0] / losses[-1] >= 100


def test_gan_records_both_losses_and_its_samples_approach_the_data():
    learn, before, after = _load("gan").main()
    history = learn.recorder.history
    assert len(history) == 30
    assert all(math.isfinite(row["train_loss"]) and math.isfinite(row["d_loss"]) for row in history)
    assert after < 0.3 * before
