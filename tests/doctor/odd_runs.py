"""Healthy runs that only look odd (issue 24 item 9): what each trains, and the loops that train it.

Each builder returns a fresh :class:`OddRun` — model, data, loss, optimizer, schedule — that is healthy by
design but looks odd to a naive rule: a GAN generator whose loss is a game, a frozen backbone with its
BatchNorm in eval, adapters whose bases get no gradient, a loss that falls slowly, a learning rate that
starts near zero, skipped fp16 steps, the PyTorch examples' programs as they are written there. The
loops train it as a user would write each one: :func:`fit_learner` (hookscope's Learner with
``hs.callbacks.Doctor()`` at its defaults), :func:`fit_plain` (a hand-written loop under
``hs.watch(model, opt)`` with ``w.log(loss)``), and, for the plain classifiers, the Lightning, fastai and
Hugging Face loops of ``tests/integrations/loops.py``. Each returns an :class:`Outcome`.

Everything runs on the CPU in seconds, on scikit-learn's bundled digits or synthetic tokens; nothing is
downloaded (torchvision-free, transformers models from a config).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.data.digits import digits_tensors
from hookscope.doctor.findings import Finding

OptFunc = Callable[..., torch.optim.Optimizer]
TESTS = Path(__file__).resolve().parents[1]


# ---- a run and what came of it ---------------------------------------------------------------------------


@dataclass
class OddRun:
    """One healthy run. ``loss_func(pred, target)`` as the Learner calls it; ``scheduler(opt)`` is stepped
    after every optimizer step (``"step"``) or every epoch; ``accumulate`` batches per optimizer step;
    ``precision`` an autocast dtype (float16 with a GradScaler starting at ``init_scale``); ``cbs`` extra
    Learner callbacks (a GAN's discriminator trainer); ``plain`` replaces the generic hand-written loop
    for runs whose loop is their own (GANs, the word language model); ``adversary`` is a GAN's
    discriminator and the criterion both players use, for the loops written out here."""

    model: nn.Module
    train: DataLoader
    loss_func: Callable[..., torch.Tensor]
    lr: float
    opt_func: OptFunc = torch.optim.AdamW
    epochs: int = 1
    valid: DataLoader | None = None
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    interval: str = "step"
    accumulate: int = 1
    precision: torch.dtype | None = None
    init_scale: float = 2.0**16
    clip: float | None = None
    cbs: list[hs.Callback] = field(default_factory=list)
    plain: Callable[[OddRun], Outcome] | None = None
    adversary: tuple[nn.Module, nn.Module] | None = None


@dataclass
class Outcome:
    """What the doctor said about a run, the optimizer steps it saw, and the steps a grad scaler skipped."""

    findings: list[Finding]
    steps: int
    skipped: int = 0

    def summary(self) -> str:
        """Every finding as ``kind `module` step N: message``, one per line."""
        lines = [f"{f.kind} `{f.module}` step {f.step}: {f.message}" for f in self.findings]
        return "\n".join(lines) or "no finding"


# ---- the loops -------------------------------------------------------------------------------------------


def fit_learner(run: OddRun) -> Outcome:
    """hookscope's Learner with ``Doctor()`` at its defaults, and the run's schedule, accumulation,
    precision and clipping as the Learner's own callbacks."""
    doctor = hs.callbacks.Doctor()
    cbs: list[hs.Callback] = [doctor, *run.cbs]
    if run.scheduler is not None:
        cbs.append(hs.callbacks.LRScheduler(run.scheduler, interval=run.interval))
    if run.accumulate > 1:
        cbs.append(hs.callbacks.GradientAccumulation(run.accumulate))
    if run.precision is not None:
        cbs.append(hs.callbacks.MixedPrecision(run.precision, init_scale=run.init_scale))
    if run.clip is not None:
        cbs.append(hs.callbacks.GradientClip(run.clip))
    learn = hs.Learner(
        run.model, (run.train, run.valid), run.loss_func, run.opt_func, run.lr, cbs=cbs, progress=False
    )
    learn.fit(run.epochs)
    precision = next((cb for cb in cbs if isinstance(cb, hs.callbacks.MixedPrecision)), None)
    skipped = precision.skipped_steps if precision is not None else 0
    return Outcome(doctor.findings, learn.training_step, skipped)


def fit_plain(run: OddRun) -> Outcome:
    """A hand-written loop under ``hs.watch(model, opt)``: ``w.log(loss)``, backward (divided by
    ``accumulate``), a step and ``zero_grad`` every ``accumulate`` batches, the scheduler after it, a
    validation pass in eval mode under ``no_grad`` after each epoch, then ``model.train()`` again."""
    if run.plain is not None:
        return run.plain(run)
    model = run.model
    opt = run.opt_func(model.parameters(), lr=run.lr)
    scheduler = run.scheduler(opt) if run.scheduler is not None else None
    scaler = (
        torch.amp.GradScaler("cpu", init_scale=run.init_scale) if run.precision == torch.float16 else None
    )
    skipped = 0
    with hs.watch(model, opt) as w:
        for _ in range(run.epochs):
            model.train()
            for i, (x, y) in enumerate(run.train):
                with _autocast(run.precision):
                    loss = run.loss_func(model(x), y)
                w.log(loss)
                loss = loss / run.accumulate
                (scaler.scale(loss) if scaler else loss).backward()
                if (i + 1) % run.accumulate and i + 1 < len(run.train):
                    continue
                skipped += not _step(opt, scaler, model, run.clip)
                opt.zero_grad()
                if scheduler is not None and run.interval == "step":
                    scheduler.step()
            if scheduler is not None and run.interval == "epoch":
                scheduler.step()
            _validate(model, run, w)
    return Outcome(w.findings, w.step, skipped)


def _autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _step(opt: torch.optim.Optimizer, scaler: Any, model: nn.Module, clip: float | None) -> bool:
    """One optimizer step as a user writes it (unscale, clip, step, update); False when the scaler
    skipped it because the gradients overflowed."""
    if scaler is None:
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return True
    scaler.unscale_(opt)
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale() >= scale


def _validate(model: nn.Module, run: OddRun, w: hs.Watch) -> None:
    if run.valid is None:
        return
    model.eval()
    with torch.no_grad():
        for x, y in run.valid:
            w.log(run.loss_func(model(x), y))
    model.train()


def _import_once(name: str, path: Path) -> Any:
    """The module at ``path`` (a helper or an example, not on ``sys.path``), imported once as ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _loops_module() -> Any:
    """``tests/integrations/loops.py``: one training in five loops."""
    return _import_once("loops", TESTS / "integrations" / "loops.py")


def fit_framework(name: str, run: OddRun, **options: Any) -> Outcome:
    """A plain classifier (cross-entropy on ``(x, y)`` batches, one epoch, no schedule) in the Lightning,
    fastai or HF Trainer loop of ``tests/integrations/loops.py``, hookscope's callback at its defaults
    (``options``: the loop's own, such as the HF Trainer's ``out`` folder)."""
    steps = len(run.train)
    findings = _loops_module().LOOPS[name](run.model, run.train, steps, run.lr, run.opt_func, **options)
    return Outcome(findings, steps)


def fit_transformers_lm(run: OddRun, out: str) -> Outcome:
    """A GPT-2 run (:func:`gpt2_from_scratch`) in HF's Trainer as its users write it: the model computes its
    own loss from ``labels`` (the inputs; it shifts them), AdamW at the run's lr, no clipping, hookscope's
    callback at its defaults."""
    from transformers import Trainer

    from hookscope.integrations.transformers import HookscopeCallback

    callback = HookscopeCallback()
    model = run.model.gpt2
    examples = [{"input_ids": x, "labels": x} for x, _ in run.train.dataset]
    steps = len(run.train)
    args = _loops_module().hf_arguments(out, steps, run.train.batch_size, run.lr, max_grad_norm=0.0)
    trainer = Trainer(model=model, args=args, train_dataset=examples, callbacks=[callback])
    try:
        trainer.train()
    finally:
        callback.close()  # the Trainer fires no event when training raises
    return Outcome(callback.findings, callback.watch.step if callback.watch is not None else 0)


# ---- data ------------------------------------------------------------------------------------------------


def digits(
    batch_size: int = 32, size: int = 8, flat: bool = False, seed: int = 0
) -> tuple[DataLoader, DataLoader]:
    """Shuffled training and ordered validation loaders over the bundled digits (normalised pixels)."""
    x, y, x_valid, y_valid = digits_tensors(size=size)
    if flat:
        x, x_valid = x.flatten(1), x_valid.flatten(1)
    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=gen)
    return train, DataLoader(TensorDataset(x_valid, y_valid), batch_size=256)


def digit_pixels(size: int, low: float = 0.0) -> torch.Tensor:
    """All 1797 digits upscaled to ``size``, pixels in ``[low, 1]`` (raw, not normalised: images to make)."""
    from sklearn.datasets import load_digits

    images = torch.as_tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16
    if size != 8:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images.clamp(0, 1) * (1 - low) + low


def markov_tokens(n: int, vocab: int, seed: int = 0, successors: int = 3) -> torch.Tensor:
    """A token stream with structure: each token is followed by one of ``successors`` tokens of its own,
    so a language model can bring the loss from ln(vocab) down to about ln(successors)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randint(vocab, (vocab, successors), generator=gen)
    choice = torch.randint(successors, (n,), generator=gen)
    tokens = torch.empty(n, dtype=torch.int64)
    tokens[0] = 0
    for i in range(1, n):
        tokens[i] = table[tokens[i - 1], choice[i]]
    return tokens


def next_token_loader(tokens: torch.Tensor, length: int, batch_size: int, seed: int = 0) -> DataLoader:
    """``(input, target)`` windows of ``length`` tokens, the target shifted by one, shuffled."""
    n = (len(tokens) - 1) // length
    x = tokens[: n * length].view(n, length)
    y = tokens[1 : n * length + 1].view(n, length)
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=gen)


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position of ``(batch, time, vocab)`` logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---- classifiers that look odd ---------------------------------------------------------------------------


def small_cnn(width: int = 8) -> nn.Sequential:
    """Two 3x3 convolutions and a linear head for 8x8 digits."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * width, 10),
    )


def slow_starter() -> OddRun:
    """A small CNN under plain SGD at lr 0.07: over its 90 steps the loss falls only from 2.30 to 2.23
    (medians of 25 steps) while the validation accuracy climbs from 0.12 to 0.38 (measured; the issue's
    run: 2.32 -> 2.23 over 84 steps, accuracy 0.10 -> 0.45) — slow, but it is learning."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16)
    model = small_cnn(width=16)
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=0.07, opt_func=torch.optim.SGD, valid=valid)


def dropout_heavy() -> OddRun:
    """An MLP with dropout 0.5 after each of its three hidden layers: a noisy loss, half the units zero."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16, flat=True)
    model = nn.Sequential(
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(64, 10),
    )
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, valid=valid)


class FrozenBackbone(nn.Module):
    """A convolutional backbone with BatchNorm, frozen and kept in eval mode (its running statistics are
    those it was calibrated with), under a trained linear head — transfer learning as users write it:
    ``train()`` is overridden so that no loop's ``model.train()`` puts the backbone back in training."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def train(self, mode: bool = True) -> FrozenBackbone:
        super().train(mode)
        self.backbone.eval()
        return self


def frozen_backbone() -> OddRun:
    """The backbone "pretrained" for a few steps on the digits with a head of its own, then frozen with
    its BatchNorm in eval; a fresh head trains on top."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16)
    model = FrozenBackbone()
    _pretrain(model, train, keep=_every_sample, steps=60)
    model.backbone.requires_grad_(False)
    model.head.reset_parameters()
    model.train()
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, valid=valid)


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``B @ A`` (B starts at zero, so the adapted
    layer starts as the base and A gets no gradient on the first step), scaled by ``alpha / rank``."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * (x @ self.lora_A.T @ self.lora_B.T)


def lora_adapters() -> OddRun:
    """An MLP briefly trained on the digits' first five classes (the "pretrained" bases), then adapted to
    all ten with LoRA on every Linear: the bases frozen, only the adapters learn."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16, flat=True)
    base = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    _pretrain(base, train, keep=lambda y: y < 5, steps=60)
    model = nn.Sequential(*(LoRALinear(m) if isinstance(m, nn.Linear) else m for m in base))
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, valid=valid)


def _pretrain(model: nn.Module, train: DataLoader, keep: Callable, steps: int, lr: float = 3e-3) -> None:
    """A few Adam steps on the batches' samples that ``keep(y)`` selects (no doctor: the "pretraining")."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in itertools.islice(itertools.cycle(train), steps):
        mask = keep(y)
        F.cross_entropy(model(x[mask]), y[mask]).backward()
        opt.step()
        opt.zero_grad()


def _every_sample(y: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(y, dtype=torch.bool)


def finetune_low_lr() -> OddRun:
    """A pretrained MLP fine-tuned at lr 1e-5 on the same task: the loss barely moves, and that is right."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16, flat=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    _pretrain(model, train, keep=_every_sample, steps=150)
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=1e-5, valid=valid)


def validation_switching() -> OddRun:
    """A CNN with BatchNorm and Dropout, validated after each of three epochs: eval, then train again."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=64)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(128, 10),
    )
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, epochs=3, valid=valid)


def gradient_accumulation() -> OddRun:
    """Four backward passes per optimizer step (batches of 8 for an effective 32), zeroed after the step."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=8, flat=True)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, epochs=2, valid=valid, accumulate=4)


def warmup_cosine() -> OddRun:
    """A linear warm-up from 1% of the peak over the first 20 steps, then cosine decay to zero (per step)."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16)
    schedule = warmup_then_cosine(0.01, 20, 2 * len(train))
    return OddRun(
        small_cnn(), train, nn.CrossEntropyLoss(), lr=1e-2, epochs=2, valid=valid, scheduler=schedule
    )


def warmup_then_cosine(start: float, warm: int, total: int) -> Callable[[torch.optim.Optimizer], Any]:
    """A scheduler maker: a linear warm-up from ``start`` x the peak over ``warm`` steps, then cosine decay
    to zero at step ``total``."""

    def schedule(opt: torch.optim.Optimizer) -> Any:
        lr = torch.optim.lr_scheduler
        return lr.SequentialLR(
            opt,
            [lr.LinearLR(opt, start, 1.0, total_iters=warm), lr.CosineAnnealingLR(opt, T_max=total - warm)],
            milestones=[warm],
        )

    return schedule


class TinyViT(nn.Module):
    """A vision transformer as its papers write it: 4x4 patches of 16x16 digits embedded by a strided
    convolution, a class token and position embeddings that start at zero (torch.zeros), pre-norm blocks
    with GELU and dropout 0.1, a LayerNorm and a linear head on the class token."""

    def __init__(self, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.patches = nn.Conv2d(1, width, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.zeros(1, 17, width))
        layer = nn.TransformerEncoderLayer(
            width, 4, 2 * width, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], 1) + self.pos
        return self.head(self.norm(self.blocks(tokens)[:, 0]))


def vit_zero_init() -> OddRun:
    """:class:`TinyViT` under AdamW (weight decay 0.05) at 1e-3 with a linear warm-up over 20 steps, then
    cosine decay, per step; label smoothing 0.1, gradients clipped at norm 1. The zero-initialised class
    token and position embeddings change by 2/(n+1) of their size at the n-th warm-up step."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=64, size=16)
    schedule = warmup_then_cosine(0.05, 20, 3 * len(train))
    return OddRun(
        TinyViT(),
        train,
        nn.CrossEntropyLoss(label_smoothing=0.1),
        lr=1e-3,
        opt_func=partial(torch.optim.AdamW, weight_decay=0.05),
        epochs=3,
        valid=valid,
        scheduler=schedule,
        clip=1.0,
    )


def one_cycle() -> OddRun:
    """``OneCycleLR`` over the whole run: from lr/25 up to 1e-2 and down to lr/1e4·25, momentum cycled."""
    torch.manual_seed(0)
    train, valid = digits(batch_size=16)
    total = 2 * len(train)
    schedule = partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=1e-2, total_steps=total)
    return OddRun(
        small_cnn(), train, nn.CrossEntropyLoss(), lr=1e-2, epochs=2, valid=valid, scheduler=schedule
    )


def _mixed_precision_mlp() -> tuple[nn.Module, DataLoader, DataLoader]:
    torch.manual_seed(0)
    train, valid = digits(batch_size=16, flat=True)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), train, valid


def fp16_skipped_steps() -> OddRun:
    """float16 autocast on the CPU with a GradScaler started at 2**40: the scaled gradients overflow
    float16, so the first steps are skipped while the scale halves down to one that fits — as every fp16
    run does at its start with the default 2**16 on a large model, provoked here on a small one."""
    model, train, valid = _mixed_precision_mlp()
    return OddRun(
        model, train, nn.CrossEntropyLoss(), lr=3e-3, valid=valid, precision=torch.float16, init_scale=2.0**40
    )


def bf16_autocast() -> OddRun:
    """bfloat16 autocast on the CPU (no scaler: bfloat16 has float32's range); coarse, noisy logits."""
    model, train, valid = _mixed_precision_mlp()
    return OddRun(model, train, nn.CrossEntropyLoss(), lr=3e-3, valid=valid, precision=torch.bfloat16)


# ---- language models -------------------------------------------------------------------------------------


class TiedContextLM(nn.Module):
    """A next-token model over the last ``context`` tokens whose output head *is* its embedding: the
    embedding gets gradients twice, from the input side and from the output side."""

    def __init__(self, vocab: int = 128, dim: int = 32, context: int = 4) -> None:
        super().__init__()
        self.context = context
        self.embedding = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(context * dim, 64), nn.GELU(), nn.Linear(64, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.embedding(tokens)  # (batch, time, dim)
        padded = F.pad(emb, (0, 0, self.context - 1, 0))
        windows = padded.unfold(1, self.context, 1)  # (batch, time, dim, context)
        return self.head(self.mix(windows.transpose(2, 3).flatten(2)))


def weight_tying() -> OddRun:
    torch.manual_seed(0)
    train = next_token_loader(markov_tokens(20_000, 128), length=32, batch_size=8)
    return OddRun(TiedContextLM(), train, token_loss, lr=3e-3)


class LSTMLanguageModel(nn.Module):
    """Embedding, a one-layer LSTM (batch first), a linear head over the vocabulary."""

    def __init__(self, vocab: int = 128, dim: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(out)


def lstm_language_model() -> OddRun:
    torch.manual_seed(0)
    train = next_token_loader(markov_tokens(20_000, 128), length=32, batch_size=8)
    return OddRun(LSTMLanguageModel(), train, token_loss, lr=3e-3)


class GPT2Logits(nn.Module):
    """transformers' ``GPT2LMHeadModel`` returning its logits (the loops' losses take a tensor)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers import GPT2LMHeadModel

        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt2(input_ids=tokens).logits


def gpt2_from_scratch(
    n_layer: int = 4, n_embd: int = 64, n_head: int = 4, steps: int = 120, batch: int = 4, length: int = 32
) -> OddRun:
    """A GPT-2 decoder with the full 50257-token vocabulary trained from scratch, ``steps`` batches of
    ``batch`` x ``length`` tokens from a structured stream over 2,000 of those tokens, at AdamW lr 1e-3:
    the loss falls steadily from ln(50257) = 10.8 (to ~7.7 by step 120, as in the issue's run)."""
    from transformers import GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=64, vocab_size=50257)
    tokens = markov_tokens(steps * batch * length + 1, 2000) * 25  # spread over the vocabulary
    train = next_token_loader(tokens, length=length, batch_size=batch)
    return OddRun(GPT2Logits(config), train, token_loss, lr=1e-3)


def gpt2_first_steps() -> OddRun:
    """The first 8 steps of :func:`gpt2_from_scratch` in batches of 16. At step 0 the gradient flowing out
    of the position embedding ``wpe`` is ~180x larger per value than at the head's output (measured):
    ``wpe``'s output is shared by the batch, so its gradient sums over it (and grows with the batch; at 4
    it stays under the rule's 100x), while the head's spreads over 50257 logits."""
    return gpt2_from_scratch(steps=8, batch=16)


def gpt2_124m() -> OddRun:
    """The full 124 M GPT-2 (12 blocks, 768 wide, 12 heads) for its first 4 steps, in batches of 16."""
    return gpt2_from_scratch(n_layer=12, n_embd=768, n_head=12, steps=4, batch=16)


# ---- adversarial training --------------------------------------------------------------------------------


def _example(name: str) -> Any:
    """A module of the repository's ``examples/`` folder."""
    return _import_once(f"example_{name}", TESTS.parent / "examples" / f"{name}.py")


def _adam_gan(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr, betas=(0.5, 0.999))


def tiny_generator(nz: int = 16) -> nn.Sequential:
    """DCGAN-style: noise ``(nz, 1, 1)`` up to a 16x16 image in [-1, 1] through transposed convolutions."""
    return nn.Sequential(
        nn.ConvTranspose2d(nz, 32, 4, 1, 0, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.ConvTranspose2d(16, 1, 4, 2, 1, bias=False),
        nn.Tanh(),
    )


def tiny_discriminator() -> nn.Sequential:
    """DCGAN-style: a 16x16 image down to one real/fake logit through strided convolutions."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 4, 2, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.LeakyReLU(0.2),
        nn.Conv2d(32, 1, 4, 1, 0, bias=False),
        nn.Flatten(0),
    )


def _noise_and_images(images: torch.Tensor, nz: int, batch_size: int) -> DataLoader:
    """``(noise, real image)`` batches: what a generator trained by the Learner reads (``xb``, ``yb``)."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(len(images), nz, 1, 1, generator=gen)
    return DataLoader(TensorDataset(noise, images), batch_size=batch_size, shuffle=True, generator=gen)


def tiny_gan() -> OddRun:
    """A tiny DCGAN on the digits at 16x16: the Learner steps the generator (its loss: the discriminator
    fooled), the examples' ``DiscriminatorTrainer`` callback steps the discriminator after each batch.
    The generator's loss is a game, not a descent: it rises whenever the discriminator gets better."""
    gan = _example("gan")
    torch.manual_seed(0)
    generator, discriminator = tiny_generator(), tiny_discriminator()
    train = _noise_and_images(digit_pixels(16, low=-1.0), nz=16, batch_size=32)
    return OddRun(
        generator,
        train,
        gan.GeneratorLoss(discriminator),
        lr=2e-4,
        opt_func=_adam_gan,
        cbs=[gan.DiscriminatorTrainer(discriminator, lr=2e-4)],
        plain=_gan_plain,
        adversary=(discriminator, nn.BCEWithLogitsLoss()),
    )


def _gan_plain(run: OddRun) -> Outcome:
    """dcgan/main.py's loop: a discriminator step on real and detached fake images, then a generator step
    on the discriminator's verdict; the user watches the generator with its optimizer."""
    generator, (discriminator, criterion) = run.model, run.adversary
    opt_d = _adam_gan(discriminator.parameters(), run.lr)
    opt_g = run.opt_func(generator.parameters(), lr=run.lr)
    with hs.watch(generator, opt_g) as w:
        for _ in range(run.epochs):
            for noise, real in run.train:
                discriminator.zero_grad()
                out_real = discriminator(real)
                criterion(out_real, torch.ones_like(out_real)).backward()
                fake = generator(noise)
                out_fake = discriminator(fake.detach())
                criterion(out_fake, torch.zeros_like(out_fake)).backward()
                opt_d.step()
                generator.zero_grad()
                out = discriminator(fake)
                loss_g = criterion(out, torch.ones_like(out))
                w.log(loss_g)
                loss_g.backward()
                opt_g.step()
    return Outcome(w.findings, w.step)


def fit_lightning_gan(run: OddRun) -> Outcome:
    """A GAN run in Lightning as its users write one: manual optimization, the discriminator's step then
    the generator's in ``training_step``, two optimizers from ``configure_optimizers``; hookscope's
    callback watches the generator (``HookscopeCallback(model=generator)``) at its defaults."""
    import lightning.pytorch as pl

    from hookscope.integrations.lightning import HookscopeCallback

    generator, (discriminator, criterion) = run.model, run.adversary

    class LitGAN(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.generator, self.discriminator = generator, discriminator
            self.automatic_optimization = False

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            noise, real = batch
            opt_g, opt_d = self.optimizers()
            fake = self.generator(noise)
            out_real, out_fake = self.discriminator(real), self.discriminator(fake.detach())
            loss_d = criterion(out_real, torch.ones_like(out_real))
            loss_d = loss_d + criterion(out_fake, torch.zeros_like(out_fake))
            opt_d.zero_grad()
            self.manual_backward(loss_d)
            opt_d.step()
            out = self.discriminator(fake)
            loss_g = criterion(out, torch.ones_like(out))
            opt_g.zero_grad()
            self.manual_backward(loss_g)
            opt_g.step()
            return loss_g

        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            return [
                run.opt_func(generator.parameters(), lr=run.lr),
                _adam_gan(discriminator.parameters(), run.lr),
            ]

    callback = HookscopeCallback(model=generator)
    steps = 2 * run.epochs * len(run.train)  # Lightning counts the steps of both optimizers
    trainer = _loops_module().lightning_trainer(steps, callback, max_epochs=run.epochs)
    trainer.fit(LitGAN(), run.train)
    return Outcome(callback.findings, callback.watch.step if callback.watch is not None else 0)


def cyclegan() -> OddRun:
    """The seed's CycleGAN (examples/cyclegan.py) for two epochs: the Learner steps both generators, the
    article's ``CycleGANTrainer`` both discriminators."""
    example = _example("cyclegan")
    learn = example.cyclegan_learner()  # the example's own data, model, loss and optimizer
    trainer = next(cb for cb in learn.cbs if isinstance(cb, example.CycleGANTrainer))
    return OddRun(
        learn.model,
        learn.dls.train,
        learn.loss_func,
        lr=learn.lr,
        opt_func=learn.opt_func,
        epochs=2,
        cbs=[trainer],
        plain=_cyclegan_plain,
    )


def _cyclegan_plain(run: OddRun) -> Outcome:
    """The same training written by hand: the generators' step on the adversarial and cycle loss with the
    discriminators frozen, then the discriminators' step; the user watches the model with the generators'
    optimizer."""
    cgan, loss_g = run.model, run.loss_func
    opt_g = run.opt_func([*cgan.G_A.parameters(), *cgan.G_B.parameters()], lr=run.lr)
    opt_d = run.opt_func([*cgan.D_A.parameters(), *cgan.D_B.parameters()], lr=run.lr)
    crit = loss_g.crit
    with hs.watch(cgan, opt_g) as w:
        for _ in range(run.epochs):
            for real_A, real_B in run.train:
                cgan.D_A.requires_grad_(False)
                cgan.D_B.requires_grad_(False)
                loss_g.set_input((real_A, real_B))
                pred = cgan((real_A, real_B))
                fake_A, fake_B = pred[0], pred[1]
                loss = loss_g(pred, real_B)
                w.log(loss)
                loss.backward()
                opt_g.step()
                opt_g.zero_grad()
                cgan.D_A.requires_grad_(True)
                cgan.D_B.requires_grad_(True)
                loss_d = crit(cgan.D_A(real_A), 1) + crit(cgan.D_A(fake_A.detach()), 0)
                loss_d = loss_d + crit(cgan.D_B(real_B), 1) + crit(cgan.D_B(fake_B.detach()), 0)
                (0.5 * loss_d).backward()
                opt_d.step()
                opt_d.zero_grad()
    return Outcome(w.findings, w.step)


# ---- the PyTorch examples repository's programs (github.com/pytorch/examples), in our own words ------------


class MnistNet(nn.Module):
    """mnist/main.py's ``Net``: two convolutions and two linear layers with ``F.relu`` between them (no
    ReLU modules), max-pooling, dropout 0.25 and 0.5, log-softmax out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def _mnist_like(size: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits at 28x28 normalised as mnist/main.py normalises MNIST (mean 0.1307, std 0.3081)."""
    from sklearn.datasets import load_digits

    labels = torch.as_tensor(load_digits().target, dtype=torch.int64)
    return (digit_pixels(size) - 0.1307) / 0.3081, labels


def examples_mnist() -> OddRun:
    """mnist/main.py: Adadelta at lr 1.0, StepLR(step_size=1, gamma=0.7) stepped per epoch, batches of 64,
    a test pass in eval mode after each epoch; here two epochs over 1,600 of the digits (50 steps)."""
    torch.manual_seed(1)
    x, y = _mnist_like()
    gen = torch.Generator().manual_seed(1)
    train = DataLoader(TensorDataset(x[:1600], y[:1600]), batch_size=64, shuffle=True, generator=gen)
    valid = DataLoader(TensorDataset(x[1600:], y[1600:]), batch_size=1000)
    return OddRun(
        MnistNet(),
        train,
        F.nll_loss,
        lr=1.0,
        opt_func=torch.optim.Adadelta,
        epochs=2,
        valid=valid,
        scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.7),
        interval="epoch",
    )


class VAE(nn.Module):
    """vae/main.py's VAE: 784 -> 400 -> (mu, logvar) of 20, a reparameterised sample, 20 -> 400 -> 784."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x.view(-1, 784)))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae_loss(pred: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
    """vae/main.py's loss: binary cross-entropy summed over pixels and batch, plus the KL divergence."""
    recon, mu, logvar = pred
    bce = F.binary_cross_entropy(recon, x.view(-1, 784), reduction="sum")
    return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def examples_vae() -> OddRun:
    """vae/main.py: Adam at 1e-3, batches of 128, a test pass after each epoch; five epochs of the digits
    at 28x28 in [0, 1] (their own targets)."""
    torch.manual_seed(1)
    images = digit_pixels(28)
    gen = torch.Generator().manual_seed(1)
    train = DataLoader(
        TensorDataset(images[:1500], images[:1500]), batch_size=128, shuffle=True, generator=gen
    )
    valid = DataLoader(TensorDataset(images[1500:], images[1500:]), batch_size=128)
    return OddRun(VAE(), train, vae_loss, lr=1e-3, opt_func=torch.optim.Adam, epochs=5, valid=valid)


def dcgan_weights_init(m: nn.Module) -> None:
    """dcgan/main.py's initialisation: convolutions N(0, 0.02), BatchNorm weights N(1, 0.02), biases 0."""
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def dcgan_generator(nz: int = 100, ngf: int = 8, nc: int = 1) -> nn.Sequential:
    """dcgan/main.py's ``Generator``: noise to a 64x64 image in five transposed convolutions."""
    layers: list[nn.Module] = []
    widths = [nz, ngf * 8, ngf * 4, ngf * 2, ngf]
    for i, (c_in, c_out) in enumerate(itertools.pairwise(widths)):
        stride, pad = (1, 0) if i == 0 else (2, 1)
        layers += [
            nn.ConvTranspose2d(c_in, c_out, 4, stride, pad, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(True),
        ]
    return nn.Sequential(*layers, nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())


def dcgan_discriminator(ndf: int = 8, nc: int = 1) -> nn.Sequential:
    """dcgan/main.py's ``Discriminator``: a 64x64 image to a probability in five convolutions."""
    layers: list[nn.Module] = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
    for c_in, c_out in itertools.pairwise([ndf, ndf * 2, ndf * 4, ndf * 8]):
        layers += [
            nn.Conv2d(c_in, c_out, 4, 2, 1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.LeakyReLU(0.2, inplace=True),
        ]
    layers += [nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid(), nn.Flatten(0)]
    return nn.Sequential(*layers)


class BCEDiscriminatorTrainer(hs.Callback):
    """dcgan/main.py's discriminator step as a Learner callback: real images labelled 1, the generator's
    (detached) images 0, ``nn.BCELoss`` on the discriminator's probabilities, its own Adam."""

    run_valid = False

    def __init__(self, discriminator: nn.Module, lr: float) -> None:
        self.discriminator, self.criterion = discriminator, nn.BCELoss()
        self.opt = _adam_gan(discriminator.parameters(), lr)

    def after_batch(self) -> None:
        if self.learn.pred is None:
            return
        real, fake = self.learn.yb[0], self.learn.pred.detach()
        self.discriminator.zero_grad()
        out_real, out_fake = self.discriminator(real), self.discriminator(fake)
        loss = self.criterion(out_real, torch.ones_like(out_real))
        (loss + self.criterion(out_fake, torch.zeros_like(out_fake))).backward()
        self.opt.step()


class BCEGeneratorLoss:
    """dcgan/main.py's generator loss: ``BCELoss`` of the discriminator's verdict against "real"."""

    def __init__(self, discriminator: nn.Module) -> None:
        self.discriminator, self.criterion = discriminator, nn.BCELoss()

    def __call__(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        out = self.discriminator(fake)
        return self.criterion(out, torch.ones_like(out))


def examples_dcgan() -> OddRun:
    """dcgan/main.py at 64x64 with its own flags --ngf 8 --ndf 8 (the default 64 is for a GPU), nz 100,
    Adam 2e-4 with beta1 0.5, batches of 32, one epoch of all 1797 digits in [-1, 1]."""
    torch.manual_seed(999)
    generator, discriminator = dcgan_generator(), dcgan_discriminator()
    generator.apply(dcgan_weights_init)
    discriminator.apply(dcgan_weights_init)
    train = _noise_and_images(digit_pixels(64, low=-1.0), nz=100, batch_size=32)
    return OddRun(
        generator,
        train,
        BCEGeneratorLoss(discriminator),
        lr=2e-4,
        opt_func=_adam_gan,
        cbs=[BCEDiscriminatorTrainer(discriminator, lr=2e-4)],
        plain=_gan_plain,
        adversary=(discriminator, nn.BCELoss()),
    )


class RNNModel(nn.Module):
    """word_language_model/model.py's ``RNNModel`` (LSTM): a dropped-out embedding, the recurrent layers, a
    dropped-out output and a decoder whose weight is the encoder's (``--tied``); sequence first."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.ntoken, self.nhid, self.nlayers = ntoken, nhid, nlayers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # tied: ninp == nhid
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(
        self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, Any]:
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        shape = (self.nlayers, batch_size, self.nhid)
        return weight.new_zeros(shape), weight.new_zeros(shape)


def bptt_batches(tokens: torch.Tensor, batch_size: int, bptt: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """main.py's ``batchify`` and ``get_batch``: the stream cut into ``batch_size`` columns, then
    ``(data, target)`` slices of ``bptt`` rows, the target one row on and flattened."""
    n = len(tokens) // batch_size
    data = tokens[: n * batch_size].view(batch_size, n).t().contiguous()
    return [(data[i : i + bptt], data[i + 1 : i + 1 + bptt].reshape(-1)) for i in range(0, n - 1, bptt)]


class CarryHidden(hs.Callback):
    """The Learner's version of main.py's hidden state: fed to each batch detached from the last one's
    graph (``repackage_hidden``), taken back from the model's output."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def before_epoch(self) -> None:
        self.hidden = self.learn.model.init_hidden(self.batch_size)

    def before_batch(self) -> None:
        self.learn.xb = (*self.learn.xb, tuple(h.detach() for h in self.hidden))

    def after_pred(self) -> None:
        self.learn.pred, self.hidden = self.learn.pred


class SuperResolutionNet(nn.Module):
    """super_resolution/model.py's ``Net`` (ESPCN): four convolutions, one ``nn.ReLU`` module shared by the
    first three (64, 64 and 32 channels), a pixel shuffle."""

    def __init__(self, upscale_factor: int = 3) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor**2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


def examples_super_resolution() -> OddRun:
    """super_resolution/main.py: Adam at lr 0.01, mean squared error between the 3x upscaled image and the
    original; here 24x24 crops of scikit-learn's sample photograph (grey), bicubic-downscaled to 8x8,
    batches of 32, four epochs. The shared ``relu`` sees 64-channel outputs twice and a 32-channel one
    once in every forward."""
    from sklearn.datasets import load_sample_image

    torch.manual_seed(0)
    photo = torch.tensor(load_sample_image("china.jpg"), dtype=torch.float32).mean(2) / 255
    crops = photo.unfold(0, 24, 24).unfold(1, 24, 24).reshape(-1, 1, 24, 24)
    small = F.interpolate(crops, scale_factor=1 / 3, mode="bicubic", align_corners=False)
    gen = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(small, crops), batch_size=32, shuffle=True, generator=gen)
    return OddRun(SuperResolutionNet(), train, nn.MSELoss(), lr=0.01, opt_func=torch.optim.Adam, epochs=4)


def examples_word_language_model() -> OddRun:
    """word_language_model/main.py with --tied: a two-layer LSTM (64 wide here), plain SGD at lr 20 with
    the gradient norm clipped at 0.25, batches of 20 columns, bptt 35, on a structured token stream."""
    torch.manual_seed(1111)
    batch_size, bptt = 20, 35
    tokens = markov_tokens(200 * batch_size * bptt + batch_size, 200)
    batches = bptt_batches(tokens, batch_size, bptt)
    return OddRun(
        RNNModel(200, 64, 64, 2),
        DataLoader(batches, batch_size=None),
        nn.NLLLoss(),
        lr=20.0,
        opt_func=torch.optim.SGD,
        clip=0.25,
        cbs=[CarryHidden(batch_size)],
        plain=partial(_word_language_model_plain, batch_size=batch_size),
    )


def _word_language_model_plain(run: OddRun, batch_size: int) -> Outcome:
    """main.py's ``train()`` as written there: no optimizer object, ``model.zero_grad()``, the hidden
    state repackaged, the norm clipped, then ``p.data.add_(p.grad, alpha=-lr)`` by hand. With no
    optimizer to hook, the user hands ``hs.watch`` the model alone and marks the hand-written update as
    the step (``with w.optimizer_step():``)."""
    model, criterion = run.model, run.loss_func
    with hs.watch(model) as w:
        model.train()
        hidden = model.init_hidden(batch_size)
        for data, targets in run.train:
            model.zero_grad()
            hidden = tuple(h.detach() for h in hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            w.log(loss)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), run.clip)
            with w.optimizer_step():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-run.lr)
    return Outcome(w.findings, w.step)


# ---- the suite -------------------------------------------------------------------------------------------

# ---- programs with a loop of their own, and no Learner form ----------------------------------------------


def tutorial_polynomial(steps: int = 600) -> tuple[Outcome, list[float]]:
    """pytorch.org's "Learning PyTorch with Examples" (its nn and optim version): a third-degree polynomial
    fitted to sin(x) at 2,000 fixed points, the same tensor given to the model at every step (full-batch
    training), RMSprop at lr 1e-3, a summed squared error. Returns the doctor's outcome and the losses."""
    torch.manual_seed(0)
    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)
    xx = x.unsqueeze(-1).pow(torch.tensor([1, 2, 3]))
    model = nn.Sequential(nn.Linear(3, 1), nn.Flatten(0, 1))
    loss_fn = nn.MSELoss(reduction="sum")
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    losses = []
    with hs.watch(model, opt) as w:
        for _ in range(steps):
            loss = loss_fn(model(xx), y)
            w.log(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return Outcome(w.findings, w.step), losses


class Corridor:
    """A deterministic corridor of 8 cells seen as one-hot vectors: move left (0) or right (1), 1 for
    reaching the right end, -0.01 for every other move; every episode starts at the left end, where a
    move left stays put. A stand-in for reinforce.py's CartPole (no gym here)."""

    cells = 8

    def reset(self) -> torch.Tensor:
        self.at = 0
        return F.one_hot(torch.tensor(self.at), self.cells).float()

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        self.at = min(self.cells - 1, max(0, self.at + (1 if action == 1 else -1)))
        done = self.at == self.cells - 1
        return F.one_hot(torch.tensor(self.at), self.cells).float(), 1.0 if done else -0.01, done


def examples_reinforce(episodes: int = 150, moves: int = 40) -> tuple[Outcome, list[int]]:
    """reinforcement_learning/reinforce.py in a :class:`Corridor`: its ``Policy`` (128 hidden units,
    dropout 0.6, softmax), Adam at lr 1e-2, one forward per move with its log-probability kept in a list,
    one optimizer step per episode on minus the log-probabilities times the normalised discounted returns
    (gamma 0.99), the list replaced at the next episode. The loss is noise around zero, every episode's
    first input is the same start cell, and once the policy walks straight right every episode is the
    same walk. Returns the doctor's outcome and each episode's length."""
    torch.manual_seed(0)
    world = Corridor()
    policy = nn.Sequential(
        nn.Linear(world.cells, 128), nn.Dropout(p=0.6), nn.ReLU(), nn.Linear(128, 2), nn.Softmax(dim=1)
    )
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    eps = torch.finfo(torch.float32).eps
    lengths = []
    with hs.watch(policy, opt) as w:
        for _ in range(episodes):
            state, log_probs, rewards = world.reset(), [], []
            for _ in range(moves):
                m = torch.distributions.Categorical(policy(state[None]))
                action = m.sample()
                log_probs.append(m.log_prob(action))
                state, reward, done = world.step(int(action))
                rewards.append(reward)
                if done:
                    break
            returns, ret = [], 0.0
            for reward in reversed(rewards):
                ret = reward + 0.99 * ret
                returns.insert(0, ret)
            returns = torch.tensor(returns)
            returns = (returns - returns.mean()) / (returns.std() + eps) if len(returns) > 1 else returns * 0
            loss = torch.cat([-lp * r for lp, r in zip(log_probs, returns, strict=True)]).sum()
            w.log(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            lengths.append(len(rewards))
    return Outcome(w.findings, w.step), lengths


PROGRAMS: dict[str, Callable[[], tuple[Outcome, list]]] = {
    "tutorial_polynomial": tutorial_polynomial,
    "examples_reinforce": examples_reinforce,
}
"""Healthy programs whose loop is their own and has no Learner form: each returns the doctor's outcome
under ``hs.watch`` at its defaults, and what shows that it learns."""


RUNS: dict[str, Callable[[], OddRun]] = {
    "tiny_gan": tiny_gan,
    "cyclegan": cyclegan,
    "frozen_backbone": frozen_backbone,
    "lora_adapters": lora_adapters,
    "gradient_accumulation": gradient_accumulation,
    "warmup_cosine": warmup_cosine,
    "one_cycle": one_cycle,
    "vit_zero_init": vit_zero_init,
    "validation_switching": validation_switching,
    "slow_starter": slow_starter,
    "weight_tying": weight_tying,
    "lstm_language_model": lstm_language_model,
    "gpt2_from_scratch": gpt2_from_scratch,
    "gpt2_first_steps": gpt2_first_steps,
    "gpt2_124m": gpt2_124m,
    "finetune_low_lr": finetune_low_lr,
    "fp16_skipped_steps": fp16_skipped_steps,
    "bf16_autocast": bf16_autocast,
    "dropout_heavy": dropout_heavy,
    "examples_mnist": examples_mnist,
    "examples_vae": examples_vae,
    "examples_dcgan": examples_dcgan,
    "examples_word_language_model": examples_word_language_model,
    "examples_super_resolution": examples_super_resolution,
}
"""Every healthy run by name (``gpt2_first_steps`` and ``gpt2_124m`` are too short for the loss rules)."""

SHORT_RUNS = ("gpt2_first_steps", "gpt2_124m")

FRAMEWORK_RUNS = ("slow_starter", "dropout_heavy", "frozen_backbone", "lora_adapters", "finetune_low_lr")
"""The plain classifiers (cross-entropy on ``(x, y)``, one epoch, no schedule) that the Lightning, fastai and
HF Trainer loops of ``tests/integrations/loops.py`` train as they are."""
