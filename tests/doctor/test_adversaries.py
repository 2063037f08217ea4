"""A loss that is a game: another optimizer training parameters against it (a GAN), seen through torch's
global optimizer step hook in every loop, and what the doctor then keeps quiet about."""

import sys

import pytest
import torch
import torch.nn.functional as F
from faults import digits_flat, mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.doctor.engine import Engine

GLOBAL_HOOKS = sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks


def _net(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 32), nn.LeakyReLU(0.2), nn.Linear(32, n_out))


def _points(n: int = 1024) -> DataLoader:
    """(noise, real point) batches: 2-D points around (2, -1), as examples/gan.py."""
    gen = torch.Generator().manual_seed(0)
    noise, real = (
        torch.randn(n, 2, generator=gen),
        torch.tensor([2.0, -1.0]) + 0.5 * torch.randn(n, 2, generator=gen),
    )
    return DataLoader(TensorDataset(noise, real), batch_size=64)


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


class GeneratorLoss:
    def __init__(self, discriminator: nn.Module) -> None:
        self.discriminator = discriminator

    def __call__(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return _bce(self.discriminator(fake), 1.0)


class DiscriminatorStep(hs.Callback):
    """examples/gan.py's pattern: the discriminator and its optimizer live in a callback."""

    run_valid = False

    def __init__(self, discriminator: nn.Module, frozen_during_generator_step: bool = False) -> None:
        self.discriminator, self.freeze = discriminator, frozen_during_generator_step
        self.opt = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))

    def before_batch(self) -> None:
        self.discriminator.requires_grad_(not self.freeze)

    def after_batch(self) -> None:
        self.discriminator.requires_grad_(True)
        real, fake = self.learn.yb[0], self.learn.pred.detach()
        self.opt.zero_grad()
        (_bce(self.discriminator(real), 1.0) + _bce(self.discriminator(fake), 0.0)).backward()
        self.opt.step()


@pytest.mark.parametrize("frozen", [False, True], ids=["discriminator-trainable", "discriminator-frozen"])
def test_the_learners_gan_callback_makes_the_generators_loss_a_game(frozen):
    torch.manual_seed(0)
    generator, discriminator = _net(2, 2), _net(2, 1)
    doctor = hs.callbacks.Doctor(quiet=True)
    before = len(GLOBAL_HOOKS)
    learn = hs.Learner(
        generator,
        (_points(), None),
        GeneratorLoss(discriminator),
        opt_func=torch.optim.Adam,
        lr=1e-3,
        cbs=[doctor, DiscriminatorStep(discriminator, frozen)],
        progress=False,
    )
    learn.fit(4)
    adversaries = doctor.engine.adversaries
    assert adversaries.game and adversaries.names == ["Adam"]
    assert adversaries.parameters == {id(p) for p in discriminator.parameters()}
    assert not {"plateau", "oscillating_loss", "loss_divergence"} & {f.kind for f in doctor.findings}
    assert len(GLOBAL_HOOKS) == before  # nothing left registered


def test_a_hand_written_gan_loop_is_a_game_under_hs_watch_and_no_hook_is_left_after_an_error():
    torch.manual_seed(0)
    generator, discriminator = _net(2, 2), _net(2, 1)
    opt_g, opt_d = (
        torch.optim.Adam(generator.parameters(), 1e-3),
        torch.optim.Adam(discriminator.parameters(), 1e-3),
    )
    before = len(GLOBAL_HOOKS)
    with pytest.raises(RuntimeError, match="stop here"), hs.watch(generator, opt_g, quiet=True) as w:
        for i, (noise, real) in enumerate(_points()):
            opt_d.zero_grad()
            fake = generator(noise)
            (_bce(discriminator(real), 1.0) + _bce(discriminator(fake.detach()), 0.0)).backward()
            opt_d.step()
            opt_g.zero_grad()
            loss = _bce(discriminator(fake), 1.0)
            w.log(loss)
            loss.backward()
            opt_g.step()
            assert len(GLOBAL_HOOKS) == before + (not w._engine.adversaries.game)
            if i == 10:
                raise RuntimeError("stop here")
    assert w._engine.adversaries.game
    assert len(GLOBAL_HOOKS) == before


def _split_optimizers(lr: float, steps: int = 60) -> hs.Watch:
    """One MLP, two optimizers over its layers (as SparseAdam for embeddings beside Adam), both stepping
    after the same backward: no game."""
    torch.manual_seed(0)
    model = mlp(depth=3)
    opt_body = torch.optim.AdamW([*model[0].parameters(), *model[2].parameters()], lr=lr)
    opt_head = torch.optim.AdamW(model[4].parameters(), lr=lr)
    batches = [batch for _ in range(3) for batch in digits_flat().train]
    with hs.watch(model, opt_body, quiet=True) as w:
        for x, y in batches[:steps]:
            loss = F.cross_entropy(model(x), y)
            w.log(loss)
            loss.backward()
            opt_head.step()  # before the watched one: order does not matter
            opt_body.step()
            opt_body.zero_grad()
            opt_head.zero_grad()
    return w


def test_two_optimizers_over_one_model_on_one_loss_are_no_game_and_a_plateau_is_still_one():
    w = _split_optimizers(lr=1e-6)
    assert not w._engine.adversaries.game
    assert "plateau" in {f.kind for f in w.findings}


def test_under_a_game_only_a_collapse_by_orders_of_magnitude_is_divergence():
    def diagnose(rise: float) -> set[str]:
        engine = Engine(quiet=True)
        engine.adversaries.game = True
        engine.record_losses([(i, 0.7 if i < 20 else 0.7 * rise) for i in range(60)])
        return {f.kind for f in engine.diagnose()}

    assert diagnose(8.0) == set()  # a generator losing to its discriminator: BCE from 0.7 to ~5.6
    assert diagnose(2e3) == {"loss_divergence"}


def test_an_engine_dropped_without_closing_takes_its_global_hook_with_it():
    before = len(GLOBAL_HOOKS)
    engine = Engine(quiet=True)
    engine.attach(mlp(depth=2))
    assert len(GLOBAL_HOOKS) == before + 1
    del engine
    assert len(GLOBAL_HOOKS) == before
