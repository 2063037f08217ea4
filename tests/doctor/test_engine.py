"""The engine fed by explicit calls, with no training loop around it: what any adapter relies on."""

import torch
from torch import nn

from hookscope.doctor.engine import Engine
from hookscope.doctor.findings import Finding
from hookscope.doctor.selection import module_in_training


def _dead_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[0].bias.fill_(-10.0)  # the ReLU's units never fire
    return model


def _feed(engine, model, steps, x=None):
    """What an adapter does per optimizer step, by hand, on one batch (on purpose: the engine is told,
    so repeated_batch stays off)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(32, 8) if x is None else x
    engine.plan_run(batches_per_epoch=1)
    for step in range(steps):
        engine.begin_batch(step, training=True)
        loss = model(x).square().mean()
        engine.log_loss(loss, training=True)
        loss.backward()
        engine.gradients_ready()
        opt.step()
        engine.step_done()
        opt.zero_grad()
        engine.end_batch()


def test_fed_by_hand_the_engine_finds_the_dead_layer_once_and_dates_it():
    model = _dead_model()
    engine = Engine(check_every=2, quiet=True)
    engine.attach(model)
    _feed(engine, model, steps=6)
    engine.close()
    assert [(f.kind, f.module, f.step) for f in engine.findings] == [("dead_units", "1", 0)]
    assert [r.step for r in engine.activations.history["1"]] == list(range(6))
    assert [step for step, _ in engine.loss_history] == list(range(6))
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0


def _checked_steps(engine, model, steps, batches_per_step=1):
    """The training steps at whose end a check ran, with ``batches_per_step`` batches a step (the last
    call of end_batch per batch, as under gradient accumulation)."""
    checked = []
    engine.after_check.append(lambda new: checked.append(engine._step))
    engine.attach(model)
    x = torch.rand(4, 8)
    for step in range(steps):
        for _ in range(batches_per_step):
            engine.begin_batch(step, training=True)
            engine.log_loss(model(x).square().mean(), training=True)
            engine.end_batch()
    return checked


def test_the_first_check_comes_at_the_warmups_end_then_every_check_every_steps():
    model = _dead_model()
    adaptive = Engine(every=None, quiet=True)  # the Doctor's defaults: warm-up of 5, a check every 20
    assert _checked_steps(adaptive, model, 50) == [4, 24, 44]
    # several batches of the warm-up's last step (gradient accumulation): one warm-up check among them
    assert _checked_steps(Engine(every=None, quiet=True), model, 8, batches_per_step=3).count(4) == 1
    fixed = Engine(every=1, quiet=True)  # no warm-up: the first check after check_every steps
    assert _checked_steps(fixed, model, 60) == [19, 39, 59]
    assert _checked_steps(Engine(every=None, check_every=5, quiet=True), model, 16) == [4, 9, 14]


def test_records_are_kept_only_on_the_interval():
    model = _dead_model()
    engine = Engine(every=2, check_every=100, quiet=True)
    engine.attach(model)
    _feed(engine, model, steps=5)
    engine.close()
    assert [r.step for r in engine.activations.history["0"]] == [0, 2, 4]
    assert [r.step for r in engine.gradients.param_history["0.weight"]] == [0, 2, 4]


def test_a_discarded_step_leaves_no_record():
    model = _dead_model()
    engine = Engine(check_every=100, quiet=True)
    engine.attach(model)
    engine.begin_batch(0, training=True)
    model(torch.rand(4, 8)).sum().backward()
    engine.discard_batch()  # e.g. a grad scaler skipped it
    _feed(engine, model, steps=1)
    engine.close()
    (record,) = engine.activations.history["0"]
    assert record.stats.count == 32 * 16  # the fed step's batch only


def test_whole_model_kinds_are_reported_once_per_run_other_kinds_once_per_module():
    engine = Engine(quiet=True)

    def finding(kind, module):
        return Finding(kind, module, 0, "warning", "m")

    new = engine.add_findings([finding("dead_units", n) for n in ("a", "b", "a")])
    assert [f.module for f in new] == ["a", "b"]
    assert engine.add_findings([finding("loss_divergence", ""), finding("exploding_gradient", "x")]) != []
    assert engine.add_findings([finding("exploding_gradient", "y")]) == []  # whole-model: once per run
    assert len(engine.findings) == 4


def test_the_state_round_trips_and_a_restored_engine_repeats_nothing(capsys):
    model = _dead_model()
    engine = Engine(check_every=2)
    engine.attach(model)
    _feed(engine, model, steps=4)
    state = engine.state_dict()
    assert "dead_units" in capsys.readouterr().err

    restored = Engine(check_every=2)
    restored.load_state_dict(state)
    restored.attach(model)
    _feed(restored, model, steps=2)
    restored.close()
    assert capsys.readouterr().err == ""  # already printed before the stop
    assert restored.findings == engine.findings
    assert [s for s, _ in restored.loss_history][:4] == [s for s, _ in engine.loss_history]


def test_without_diagnose_the_engine_records_but_finds_nothing():
    model = _dead_model()
    engine = Engine(check_every=1, quiet=True, diagnose=False)
    engine.attach(model)
    _feed(engine, model, steps=4)
    engine.close()
    assert engine.findings == [] and len(engine.activations.history["1"]) == 4


def test_forwards_that_do_not_train_are_ignored_when_the_module_decides():
    model = _dead_model()
    engine = Engine(check_every=100, quiet=True, training_of=module_in_training)
    engine.attach(model)
    engine.begin_batch(0, training=True)
    with torch.no_grad():
        model(torch.rand(4, 8))  # evaluation: not recorded
    model(torch.rand(32, 8)).sum().backward()
    engine.end_batch()
    engine.close()
    (record,) = engine.activations.history["0"]
    assert record.stats.count == 32 * 16


def test_a_flatten_is_no_layer_of_units_but_a_dead_relu_before_it_is_still_named():
    """Inputs that are 0 outside a central 2x2 patch: after a 3x3 conv without bias, 48 of the 64
    positions of every channel are 0 for every example — dead "units" of the Flatten, while every channel
    of the ReLU is alive."""
    x = torch.zeros(32, 1, 8, 8)
    x[:, :, 3:5, 3:5] = torch.rand(32, 1, 2, 2, generator=torch.Generator().manual_seed(0)) + 0.5

    def dead_units(sign):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(256, 4)
        )
        with torch.no_grad():
            model[0].weight.copy_(sign * model[0].weight.abs())
        engine = Engine(check_every=2, quiet=True)
        engine.attach(model)
        _feed(engine, model, steps=4, x=x)
        engine.close()
        return [f.module for f in engine.findings if f.kind == "dead_units"]

    assert dead_units(+1) == []
    assert dead_units(-1) == ["1"]


def test_by_default_the_engine_watches_every_leaf_but_pure_reshapes():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Identity(), nn.Linear(72, 2))
    x = torch.rand(32, 1, 8, 8)
    engine = Engine(quiet=True)
    engine.attach(model)
    _feed(engine, model, steps=2, x=x)
    engine.close()
    assert list(engine.activations.history) == ["0", "1", "4"]
    assert list(engine.gradients.history) == ["0", "1", "4"]
    asked = Engine(select=["1", "2"], quiet=True)  # a Flatten named outright is watched
    asked.attach(model)
    _feed(asked, model, steps=2, x=x)
    asked.close()
    assert list(asked.activations.history) == ["1", "2"]


def test_a_million_steps_of_losses_keep_memory_and_checkpoint_size_flat():
    """Every history the engine keeps is bounded: from step 200,000 to 1,000,000 what it writes into a
    checkpoint does not grow, nor, late in the run, what it holds (unbounded, the loss history alone grew
    by ~80 bytes a step: 8 MB over the traced 100,000 steps)."""
    import io
    import tracemalloc

    from hookscope.doctor.loss_history import HEAD, SIZE

    engine = Engine(every=None, check_every=1000, quiet=True)
    engine.attach(nn.Sequential(nn.Linear(2, 2), nn.Tanh()))
    losses = list(torch.rand(1000, generator=torch.Generator().manual_seed(0)) + 1.0)

    def feed(start: int, stop: int) -> None:
        for step in range(start, stop):
            engine.begin_batch(step, True)
            engine.log_loss(losses[step % 1000], True)
            engine.end_batch()

    def checkpoint_bytes() -> int:
        buffer = io.BytesIO()
        torch.save(engine.state_dict(), buffer)
        return buffer.tell()

    feed(0, 200_000)
    saved_early, kept_early = checkpoint_bytes(), len(engine.loss_history)
    feed(200_000, 900_000)
    tracemalloc.start()  # tracing slows each step 5-fold: the last 100,000 steps only
    held_before = tracemalloc.get_traced_memory()[0]
    feed(900_000, 1_000_000)
    held_growth = tracemalloc.get_traced_memory()[0] - held_before
    tracemalloc.stop()
    engine.check()  # the losses since the last check (every 1,000 steps from the warm-up's, at step 4)
    assert engine.losses.total == 1_000_000 and kept_early <= HEAD + SIZE >= len(engine.loss_history)
    assert held_growth < 1_000_000  # bytes, whatever was allocated since and is still held
    # kept losses (3 numbers each in a checkpoint) refill between two thinnings: at most twice as many
    saved_late = checkpoint_bytes()
    assert saved_late < 2 * saved_early and saved_late < 200_000  # unbounded: 24 MB at step 1,000,000
    steps = [step for step, _ in engine.loss_history]
    assert steps[:HEAD] == list(range(HEAD)) and steps[-1] > 990_000  # the start dense, the run spanned
