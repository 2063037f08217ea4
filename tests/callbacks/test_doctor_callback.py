"""The Doctor as a callback (printing, deduplication, findings.json) and hs.diagnose."""

import json

import pytest
import torch
from faults import LogAct, digits_flat, mlp, train_with_doctor
from torch import nn
from torch.utils.data import DataLoader

import hookscope as hs
from hookscope.doctor.findings import Finding


def _dead_mlp():
    torch.manual_seed(0)
    model = mlp(depth=3)
    with torch.no_grad():
        model[2].bias.fill_(-10.0)
    return model


def test_findings_are_printed_once_and_kept(capsys):
    doctor = hs.callbacks.Doctor(check_every=2)
    learn = hs.Learner(_dead_mlp(), digits_flat(), nn.CrossEntropyLoss(), cbs=[doctor], progress=False)
    learn.fit(1)  # 23 steps: the rules run 12 times
    err = capsys.readouterr().err
    assert err.count("dead_units") == 1 and "layer `3`" in err
    assert [f.kind for f in learn.doctor.findings].count("dead_units") == 1
    assert learn.doctor is doctor


def test_quiet_doctor_prints_nothing(capsys):
    learn = train_with_doctor(_dead_mlp(), steps=6)
    assert learn.doctor.findings
    assert capsys.readouterr().err == ""


def test_finding_to_dict_is_json_ready():
    learn = train_with_doctor(_dead_mlp(), steps=6)
    data = json.loads(json.dumps([f.to_dict() for f in learn.doctor.findings]))
    dead = next(d for d in data if d["kind"] == "dead_units")
    assert set(dead) == {"kind", "module", "step", "severity", "message", "evidence", "explains"}
    assert dead["explains"] == []  # a symptom explains nothing; a cause lists its symptoms there
    assert dead["module"] == "3" and dead["evidence"]["dead_fraction"] == 1.0


def test_doctor_given_to_one_fit_also_works_and_leaves_no_hooks():
    model = _dead_mlp()
    learn = hs.Learner(model, digits_flat(), nn.CrossEntropyLoss(), progress=False)
    doctor = hs.callbacks.Doctor(quiet=True, check_every=3)
    learn.fit(1, cbs=[doctor])
    assert any(f.kind == "dead_units" for f in doctor.findings)
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0


def test_without_guard_a_nan_does_not_stop_the_fit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    learn = train_with_doctor(model, steps=4, guard=False)
    assert learn.training_step == 4
    assert "nonfinite" not in {f.kind for f in learn.doctor.findings}


def test_diagnose_a_model_leaves_it_untouched():
    model = _dead_mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = next(iter(digits_flat().train))
    findings = hs.diagnose(model, (x, y), steps=5, loss_func=nn.CrossEntropyLoss(), quiet=True)
    assert any(f.kind == "dead_units" and f.module == "3" for f in findings)
    assert all(isinstance(f, Finding) for f in findings)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_diagnose_a_learner_uses_its_loss_and_data_loader():
    learn = hs.Learner(_dead_mlp(), digits_flat(), nn.CrossEntropyLoss(), progress=False)
    findings = hs.diagnose(learn, learn.dls, steps=4, quiet=True)
    assert {f.kind for f in findings} >= {"dead_units"}
    assert learn.training_step == 0 and learn.opt is None


def test_diagnose_explains_a_missing_loss_and_bad_data():
    with pytest.raises(ValueError, match="loss_func"):
        hs.diagnose(nn.Linear(3, 2), (torch.randn(4, 3), torch.zeros(4)), steps=2)
    with pytest.raises(TypeError, match="DataLoader"):
        hs.diagnose(nn.Linear(3, 2), 42, steps=2, loss_func=nn.MSELoss())


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="check_every=0"):
        hs.callbacks.Doctor(check_every=0)


class _HooksAtForward(hs.Callback):
    """How many forward hooks the model's modules hold as each batch's forward ends."""

    def __init__(self):
        self.train, self.valid, self.root = {}, [], set()

    def after_pred(self):
        layers = list(self.learn.model.modules())[1:]  # the model itself holds the protocol's and timing's
        count = sum(len(m._forward_hooks) for m in layers)
        if self.learn.training:
            self.train[self.learn.training_step] = count
            self.root.add(len(self.learn.model._forward_hooks))
        else:
            self.valid.append(count)


def test_between_recorded_steps_the_model_runs_without_the_doctors_hooks():
    torch.manual_seed(0)
    seen = _HooksAtForward()
    doctor = hs.callbacks.Doctor(quiet=True)
    train = digits_flat().train
    dls = hs.DataLoaders(train, DataLoader(train.dataset, batch_size=256))
    learn = hs.Learner(mlp(depth=3), dls, nn.CrossEntropyLoss(), cbs=[doctor, seen], progress=False)
    learn.fit(3)  # 69 steps; the adaptive schedule records steps 0-4 and 50
    recorded = [r.step for r in doctor.engine.activations.history["0"]]
    assert recorded == [*range(5), 50]
    assert [step for step, count in seen.train.items() if count] == recorded
    assert len(seen.valid) == 3 * 6 and all(seen.valid)  # every validation phase is recorded
    assert seen.root == {2}  # the loop-protocol checks' and the timing's forward hooks, at every step
    assert sum(len(m._forward_hooks) for m in learn.model.modules()) == 0


class _HooksInStep(hs.Callback):
    """Forward hooks and gradient (tensor) hooks on the model during each training step's forward."""

    order = 100

    def __init__(self):
        self.forward, self.saturation = {}, {}

    def after_pred(self):
        if not self.learn.training:
            return
        model = self.learn.model
        layers = list(model.modules())[1:]  # the model itself holds the protocol's hook at every step
        self.forward[self.learn.training_step] = sum(len(m._forward_hooks) for m in layers)
        self.saturation[self.learn.training_step] = len(model[-1]._forward_hooks)  # the Tanh


def test_every_3_registers_activation_gradient_and_saturation_hooks_only_on_every_third_step():
    torch.manual_seed(0)
    seen = _HooksInStep()
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10), nn.Tanh())
    doctor = hs.callbacks.Doctor(every=3, quiet=True, guard=False)
    learn = hs.Learner(model, digits_flat(), nn.CrossEntropyLoss(), cbs=[doctor, seen], progress=False)
    learn.fit(1)  # 23 steps
    hooked = [step for step, count in seen.forward.items() if count]
    assert hooked == list(range(0, 23, 3))
    # on those steps every watched layer holds the activation and the output-gradient hook, and the
    # Tanh the saturation hook on top; on the others the model runs bare
    assert all(seen.forward[s] == 2 * 4 + 1 for s in hooked) and set(seen.saturation.values()) == {0, 3}
    assert [s for s, n in seen.saturation.items() if n] == hooked
    assert [step for step, _ in doctor.engine.saturation_history["3"]] == hooked
    assert [r.step for r in doctor.gradients.param_history["0.weight"]] == hooked


def test_the_doctor_is_one_entry_of_the_dispatch_table_and_its_guard_a_callback_of_its_own():
    doctor = hs.callbacks.Doctor(quiet=True)
    learn = hs.Learner(mlp(depth=2), digits_flat(), nn.CrossEntropyLoss(), cbs=[doctor], progress=False)
    assert [cb for cb in learn.cbs if isinstance(cb, hs.callbacks.Doctor)] == [doctor]
    assert doctor.guard in learn.cbs and doctor.guard.learn is learn
    stats = (hs.callbacks.ActivationStats, hs.callbacks.GradientStats)
    assert not any(isinstance(cb, stats) for cb in learn.cbs)
    events, _ = learn._resolve()
    owners = [method.__self__ for method in events["before_step"]]
    assert owners.count(doctor) == 1 and owners.index(doctor) < owners.index(doctor.guard)
    learn.remove_cb(doctor)
    assert doctor.guard not in learn.cbs


def test_the_doctor_reads_gradients_after_unscaling_and_before_clipping():
    doctor = hs.callbacks.Doctor(quiet=True)
    clip, precision = hs.callbacks.GradientClip(1.0), hs.callbacks.MixedPrecision()
    learn = hs.Learner(mlp(depth=2), digits_flat(), nn.CrossEntropyLoss(), cbs=[clip, doctor, precision])
    events, _ = learn._resolve()
    owners = [method.__self__ for method in events["before_step"]]
    assert owners.index(precision) < owners.index(doctor) < owners.index(clip)


class Tagger(nn.Module):
    """Token ids ``(batch, length)`` to two classes: every hidden output is ``(batch, length, width)``."""

    def __init__(self):
        super().__init__()
        self.emb, self.proj, self.act, self.head = (
            nn.Embedding(50, 16),
            nn.Linear(16, 16),
            nn.ReLU(),
            nn.Linear(16, 2),
        )

    def forward(self, ids):
        return self.head(self.act(self.proj(self.emb(ids))).mean(1))


def test_validation_batches_of_different_lengths_are_recorded_without_an_error():
    """Batches padded to their own longest sequence (a collator's dynamic padding) differ in dim 1 from
    batch to batch; a validation phase is one window of statistics, so its second batch raised
    "RunningStats got a tensor with 19 channels (dim 1) after tensors with 25 channels" out of the fit
    with Doctor() at its defaults. The batches of the phase's first layout are recorded."""
    torch.manual_seed(0)

    def batches(n):
        return [(torch.randint(0, 50, (8, 5 + 7 * (i % 3))), torch.randint(0, 2, (8,))) for i in range(n)]

    learn = hs.Learner(
        Tagger(), (batches(12), batches(6)), nn.CrossEntropyLoss(), lr=1e-3, cbs=[hs.callbacks.Doctor()]
    )
    learn.fit(2)
    valid = learn.doctor.activations.valid_history["act"]
    assert len(valid) == 2 and valid[0].stats.count == 2 * 8 * 5 * 16  # the two batches of length 5
