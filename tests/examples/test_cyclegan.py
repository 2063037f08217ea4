"""examples/cyclegan.py: article 004's CycleGANTrainer, for real — it trains, translates, draws its grid,
and saves and resumes mid-epoch like any other run."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from small_learner import StopAtStep

import hookscope as hs
from hookscope.callbacks import Recorder
from hookscope.train.callback import sort_callbacks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cyclegan.py"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for this module: the example's convolutions are tiny, and on a loaded machine two
    OpenMP threads waiting on each other cost 20 times the CPU (measured at load 12-18 on 2 cores: 251 s of
    user time for the example's run with 2 threads, 11 s with 1)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cyclegan():
    spec = importlib.util.spec_from_file_location("example_cyclegan", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(cyclegan, tmp_path_factory):
    """The example's own run: ``(learn, grid PNG, reconstruction error)``; the slow tests share it."""
    return cyclegan.main(out=tmp_path_factory.mktemp("cyclegan"))


@pytest.mark.slow
def test_the_trainer_is_the_articles_callback(cyclegan, trained):
    learn, _, _ = trained
    trainer = learn.cycle_gan_trainer
    assert cyclegan.CycleGANTrainer.run_before is Recorder  # a bare class, as the article writes it
    order = [type(cb) for cb in sort_callbacks(learn.cbs)]
    assert order.index(cyclegan.CycleGANTrainer) < order.index(Recorder)
    assert learn.opt is trainer.opt_G  # learn.opt swapped for the generators' own optimizer
    cgan = learn.model
    assert _ids(trainer.opt_G) == _ids_of(cgan.G_A, cgan.G_B)
    assert _ids(trainer.opt_D) == _ids_of(cgan.D_A, cgan.D_B)


@pytest.mark.slow
def test_losses_fall_and_land_in_the_recorders_history(trained):
    history = trained[0].recorder.history
    first, last = history[0], history[-1]
    assert set(first) >= {"train_loss", "cycle", "adversarial", "D_A_loss", "D_B_loss"}
    assert all(math.isfinite(row[key]) for row in history for key in ("cycle", "D_A_loss", "D_B_loss"))
    # measured: train_loss 7.28 -> 1.35, cycle 0.636 -> 0.060 (L1 of A -> B -> A plus B -> A -> B)
    assert last["train_loss"] < 0.3 * first["train_loss"]
    assert last["cycle"] < 0.2 * first["cycle"]
    # measured 0.18 and 0.21: neither discriminator wins outright (-> 0; 0.02 with 7×7 generators that
    # bent the digits) nor gives up (0.25 is the least-squares loss of one that cannot tell at all)
    assert all(0.05 < last[key] < 0.3 for key in ("D_A_loss", "D_B_loss"))


@pytest.mark.slow
def test_translations_invert_the_digits_and_come_back(cyclegan, trained):
    learn, _, error = trained
    real_A, real_B = cyclegan.digit_domains()
    images = cyclegan.translations(learn.model, real_A, real_B)
    # Unpaired training, yet A -> B is the inversion that made B: measured 0.037 and 0.048 per pixel off
    assert (images["fake_B"] - (1 - real_A)).abs().mean() < 0.1
    assert (images["fake_A"] - (1 - real_B)).abs().mean() < 0.1
    assert error < 0.06  # measured 0.028 (mean |pixel| of A -> B -> A and B -> A -> B, all 1796 images)


@pytest.mark.slow
def test_the_grid_is_written_and_is_not_blank(trained):
    _, path, _ = trained
    image = Image.open(path).convert("L")
    assert image.size == (10 * 16 * 4, (6 * 16 + 5 * 2) * 4)  # 6 rows of 10 digits and 5 gaps, ×4
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).float()
    assert pixels.std() > 60  # measured 89: black and white digits; a blank image has 0


@pytest.mark.usefixtures("deterministic")
def test_the_cyclegan_run_resumes_mid_epoch_bitwise(cyclegan, tmp_path):
    reference = cyclegan.cyclegan_learner()
    reference.fit(2)

    ckpt = hs.callbacks.Checkpoint(tmp_path, every_n_steps=40)
    cyclegan.cyclegan_learner(cbs=(ckpt, StopAtStep(40))).fit(2)  # 28 batches an epoch: mid-epoch 1
    torch.manual_seed(7)  # a fresh process: the checkpoint must put every RNG back
    resumed = cyclegan.cyclegan_learner(seed=3, cbs=(hs.callbacks.Checkpoint(tmp_path),))
    resumed.fit(2, resume=tmp_path / "last.pt")

    params = zip(reference.model.parameters(), resumed.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in params)
    for name in ("opt_G", "opt_D"):
        saved = getattr(reference.cycle_gan_trainer, name).state_dict()["state"]
        loaded = getattr(resumed.cycle_gan_trainer, name).state_dict()["state"]
        assert all(torch.equal(saved[i]["exp_avg_sq"], loaded[i]["exp_avg_sq"]) for i in saved)
    keys = ("train_loss", "cycle", "adversarial", "D_A_loss", "D_B_loss")
    assert [[row[k] for k in keys] for row in resumed.recorder.history] == [
        [row[k] for k in keys] for row in reference.recorder.history
    ]


def _ids(opt):
    return [id(p) for group in opt.param_groups for p in group["params"]]


def _ids_of(*modules):
    return [id(p) for module in modules for p in module.parameters()]
