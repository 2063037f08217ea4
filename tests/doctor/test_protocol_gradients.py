"""stale_gradients: named at the second optimizer step of a loop that never clears `.grad`; silent on
deliberate accumulation, zero_grad(set_to_none=False), a GAN's two optimizers and LBFGS."""

import torch
from protocol_loops import Feed, cnn, digits, train
from torch import nn


def _stale(found):
    return [f for f in found if f.kind == "stale_gradients"]


def test_missing_zero_grad_is_named_at_the_second_step():
    model = cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    feed = Feed(model, opt)
    train(model, opt, feed, digits(), steps=6, zero=False)
    [finding] = _stale(feed.close())
    assert finding.step == 1
    assert finding.severity == "error"
    assert "zero_grad()" in finding.message
    assert finding.evidence["stale_steps"] == 4  # steps 1..4, at the check after step 5


def test_zero_grad_once_per_epoch_is_named():
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    feed = Feed(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    opt.zero_grad()  # outside the batch loop: cleared once, then every step adds up
    for i, (x, y) in enumerate(digits()):
        loss_fn(model(x), y).backward()
        opt.step()
        if i == 4:
            break
    [finding] = _stale(feed.close())
    assert finding.step == 1


def test_textbook_loop_and_zero_grad_without_none_are_silent():
    for set_to_none in (True, False):
        model = cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        feed = Feed(model, opt)
        loss_fn = nn.CrossEntropyLoss()
        for i, (x, y) in enumerate(digits()):
            opt.zero_grad(set_to_none=set_to_none)
            loss_fn(model(x), y).backward()
            opt.step()
            if i == 8:
                break
        assert _stale(feed.close()) == []


def test_deliberate_accumulation_is_silent():
    model = cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    feed = Feed(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(digits(batch_size=16)):
        (loss_fn(model(x), y) / 4).backward()
        if i % 4 == 3:  # 4 backward passes, a step, then zero
            opt.step()
            opt.zero_grad()
        if i == 20:
            break
    assert feed.step == 5
    assert _stale(feed.close()) == []


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 64), nn.Tanh()
        )

    def forward(self, z):
        return self.net(z).view(-1, 1, 8, 8)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(32, 1)
        )

    def forward(self, x):
        return self.net(x).squeeze(1)


def dcgan(watched: str, steps: int = 12):
    """The PyTorch DCGAN example's loop on digits: the D step (real, then fake detached), the G step
    through D (which leaves D gradients that `netD.zero_grad()` clears). Returns the findings of a Feed
    on ``watched`` ("D" or "G") and its optimizer."""
    torch.manual_seed(0)
    netG, netD = Generator(), Discriminator()
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    feed = Feed(netD, optD) if watched == "D" else Feed(netG, optG)
    bce = nn.BCEWithLogitsLoss()
    for i, (real, _) in enumerate(digits()):
        netD.zero_grad()
        out = netD(real)
        err_real = bce(out, torch.ones_like(out))
        err_real.backward()
        with torch.no_grad() if watched == "G" else torch.enable_grad():
            fake = netG(torch.randn(real.shape[0], 8))
        out = netD(fake.detach())
        err_fake = bce(out, torch.zeros_like(out))
        err_fake.backward()
        optD.step()
        netG.zero_grad()
        fake = netG(torch.randn(real.shape[0], 8))
        out = netD(fake)
        err_g = bce(out, torch.ones_like(out))
        feed.log(err_g)
        err_g.backward()
        optG.step()
        if i == steps:
            break
    return feed.close()


def test_a_gan_with_two_optimizers_is_silent_on_either_side():
    for watched in ("D", "G"):
        assert dcgan(watched) == [], watched


def test_lbfgs_closures_are_silent():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    feed = Feed(model, opt)
    loss_fn = nn.CrossEntropyLoss()
    for i, (x, y) in enumerate(digits()):

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        if i == 5:
            break
    assert _stale(feed.close()) == []
