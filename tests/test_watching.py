"""hs.watch in a hand-written loop: the Learner's diagnosis, one step per optimizer step, no hook left."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from faults import (
    Branches,
    LogAct,
    SqrtAbs,
    dead_mlp,
    digits_flat,
    exploding_mlp,
    frozen_mlp,
    kinds,
    mlp,
    train_with_doctor,
)
from torch import nn

import hookscope as hs
from hookscope.watching import NonFiniteError

pytestmark = pytest.mark.usefixtures("deterministic")


def _plain_loop(model, steps=12, lr=1e-3, opt_func=torch.optim.AdamW, dls=None, accumulate=1, **watch_kw):
    """The loop of article 004 under hs.watch, ``steps`` optimizer steps at most; returns the Watch."""
    opt = opt_func(model.parameters(), lr=lr)
    loss_func = nn.CrossEntropyLoss()
    with hs.watch(model, opt, quiet=True, check_every=3, **watch_kw) as w:
        for i, (x, y) in enumerate((dls or digits_flat()).train):
            if w.step >= steps:
                break
            loss = loss_func(model(x), y)
            w.log(loss)
            (loss / accumulate).backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
    return w


def _watch_kinds(w):
    found = {}
    for f in w.findings:
        found.setdefault(f.kind, []).append(f)
    return found


FAULTS = {
    "dead_units": (dead_mlp, {}),
    "exploding_gradient": (exploding_mlp, {}),
    "vanishing_gradient": (lambda: mlp(depth=12, width=32, act=nn.Sigmoid), {}),
    "no_gradient": (Branches, {}),
    "frozen": (frozen_mlp, {}),
    "loss_divergence": (lambda: mlp(depth=3), {"lr": 10.0, "opt_func": torch.optim.SGD}),
    "saturation": (
        lambda: nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)),
        {"dls": digits_flat(scale=100.0)},
    ),
}


@pytest.mark.parametrize("kind", FAULTS)
def test_a_fault_gives_the_learners_finding_in_a_plain_loop(kind):
    build, train_kw = FAULTS[kind]
    torch.manual_seed(0)
    learn = train_with_doctor(build(), steps=8, **train_kw)
    torch.manual_seed(0)
    w = _plain_loop(build(), steps=8, **train_kw)
    expected = [(f.module, f.step) for f in kinds(learn)[kind]]
    assert [(f.module, f.step) for f in _watch_kinds(w)[kind]] == expected
    assert w.step == learn.training_step == 8


def test_forward_nan_raises_at_the_step_naming_the_module_and_op():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteError, match=r"module `1` \(LogAct\) at op aten.log") as caught:
        _plain_loop(model, guard=True)
    err = caught.value
    assert (err.step, err.reason, err.report.phase) == (0, "activation", "forward")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the step never ran
    assert all(p.grad is None for p in model.parameters())
    assert _hook_count(model) == 0


def test_a_backward_only_nan_is_blamed_on_the_backward_node_at_the_doctors_step():
    torch.manual_seed(0)
    learn = train_with_doctor(
        nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10)), digits_flat(zero_row=70)
    )
    (expected,) = kinds(learn)["nonfinite"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10))
    with pytest.raises(NonFiniteError) as caught:
        _plain_loop(model, dls=digits_flat(zero_row=70), guard=True)
    report = caught.value.report
    assert (report.module, report.phase, report.op) == ("1", "backward", "SqrtBackward0")
    assert (
        (caught.value.step, caught.value.reason)
        == (expected.step, expected.evidence["reason"])
        == (1, "gradient")
    )


FUSED = {"opt_func": lambda params, lr: torch.optim.AdamW(params, lr=lr, fused=True)}


def test_read_late_a_backward_nan_raises_at_the_next_step_with_the_weights_of_a_stop_before_it():
    """With a fused optimizer the guard hands it its flag (the bad update is left out on the device) and
    reads it when the next step starts: the same error, step, blame and weights as a read before."""
    outcomes = {}
    for late in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32, bias=False), SqrtAbs(), nn.Linear(32, 10))
        with pytest.raises(NonFiniteError) as caught:
            _plain_loop(model, dls=digits_flat(zero_row=70), guard=True, late=late, **FUSED)
        err = caught.value
        assert (err.step, err.reason, err.report.op) == (1, "gradient", "SqrtBackward0")
        assert all(p.grad is None for p in model.parameters()) and _hook_count(model) == 0
        outcomes[late] = model.state_dict()
    assert all(torch.equal(outcomes[False][k], v) for k, v in outcomes[True].items())


def test_read_late_a_fault_in_the_loops_last_step_is_raised_when_the_watch_closes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = next(iter(digits_flat().train))
    watched = hs.watch(model, opt, guard=True, late=True, quiet=True)
    with pytest.raises(NonFiniteError, match=r"optimizer step 0") as caught, watched:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()  # the update is left out on the device; the verdict is read at the with's end
    assert caught.value.reason == "activation"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not hasattr(opt, "found_inf")


def test_read_late_trains_a_healthy_loop_exactly_as_a_read_before_each_step():
    ends = []
    for late in (False, True):
        torch.manual_seed(0)
        model = mlp(depth=3)
        w = _plain_loop(model, guard=True, late=late, **FUSED)
        assert w.step == 12 and "nonfinite" not in _watch_kinds(w)
        ends.append(model.state_dict())
    assert all(torch.equal(ends[0][k], v) for k, v in ends[1].items())


def test_read_late_needs_a_fused_optimizer_and_takes_no_folder_lock_when_refused(tmp_path):
    model = mlp(depth=2)
    with pytest.raises(ValueError, match=r"hs.watch\(late=True\): AdamW cannot skip a step.*fused=True"):
        hs.watch(model, torch.optim.AdamW(model.parameters()), guard=True, late=True, path=tmp_path / "run")
    with hs.watch(model, torch.optim.AdamW(model.parameters()), guard=True, path=tmp_path / "run"):
        pass  # the refused Watch left neither the folder's lock nor an open Watch behind


def test_the_nonfinite_finding_matches_the_doctors():
    torch.manual_seed(0)
    learn = train_with_doctor(nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    opt = torch.optim.AdamW(model.parameters())
    w = hs.watch(model, opt, guard=True, quiet=True)
    x, y = next(iter(digits_flat().train))
    with pytest.raises(NonFiniteError):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    (expected,) = kinds(learn)["nonfinite"]
    (found,) = _watch_kinds(w)["nonfinite"]
    assert (found.module, found.step, found.severity) == (expected.module, expected.step, "error")
    assert found.evidence["op"] == expected.evidence["op"] == "aten.log"


def test_a_healthy_model_gives_no_finding_and_is_recorded_on_the_doctors_schedule_or_every_step():
    torch.manual_seed(0)
    w = _plain_loop(mlp(depth=3), steps=23)
    assert w.findings == []
    assert w.step == 23
    assert [r.step for r in w.activations["0"]] == list(range(5))  # the warm-up; then every 50th step
    assert [r.step for r in w.param_history["0.weight"]] == list(range(5))
    assert set(w.gradients) == set(w.activations) == {"0", "1", "2", "3", "4"}  # every leaf
    torch.manual_seed(0)
    every = _plain_loop(mlp(depth=3), steps=23, every=1)
    assert every.findings == []
    assert [r.step for r in every.activations["0"]] == list(range(23))
    assert [r.step for r in every.param_history["0.weight"]] == list(range(23))


def test_gradient_accumulation_counts_one_step_per_optimizer_step():
    torch.manual_seed(0)
    w = _plain_loop(mlp(depth=3), steps=100, accumulate=4)  # 23 batches: 5 optimizer steps
    assert w.step == 5
    assert [r.step for r in w.param_history["0.weight"]] == list(range(5))
    records = w.activations["0"]
    assert [r.step for r in records] == list(range(5))
    assert records[0].stats.count == 4 * 64 * 64  # the four batches of the step, one record


def test_grad_scaler_gradients_are_read_unscaled_and_a_skipped_step_is_not_counted():
    def run(scaled, spoil_at=None):
        torch.manual_seed(0)
        model = mlp(depth=3)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaled)
        with hs.watch(model, opt, quiet=True) as w:
            for i, (x, y) in enumerate(digits_flat().train):
                if i == 6:
                    break
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                if i == spoil_at:
                    model[0].weight.grad[0, 0] = float("inf")  # the scaler must skip this step
                scaler.step(opt)
                scaler.update()
        return w

    plain, scaled = run(scaled=False), run(scaled=True)
    norms = [r.grad_norm for r in scaled.param_history["4.weight"]]
    assert norms == pytest.approx([r.grad_norm for r in plain.param_history["4.weight"]], rel=1e-6)
    skipped = run(scaled=True, spoil_at=2)
    assert skipped.step == 5
    assert [r.step for r in skipped.param_history["0.weight"]] == list(range(5))
    assert [r.step for r in skipped.activations["0"]] == list(range(5))
    assert all(r.stats.nonfinite == 0 for r in skipped.gradients["0"])  # the inf window was dropped


def test_without_an_optimizer_the_caller_marks_the_steps():
    torch.manual_seed(0)
    model = dead_mlp()
    opt = torch.optim.AdamW(model.parameters())
    with hs.watch(model, quiet=True, check_every=3) as w:
        for i, (x, y) in enumerate(digits_flat().train):
            if i == 5:
                break
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            w.gradients_ready()
            opt.step()
            w.step_done()
    assert w.step == 5 and [(f.kind, f.module, f.step) for f in w.findings] == [("dead_units", "3", 0)]
    assert [r.update_ratio is not None for r in w.param_history["0.weight"]] == [True] * 5


def test_evaluation_forwards_are_not_recorded():
    torch.manual_seed(0)
    model = mlp(depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = next(iter(digits_flat().train))
    with hs.watch(model, opt, quiet=True) as w:
        nn.functional.cross_entropy(model(x), y).backward()
        model.eval()
        with torch.no_grad():
            model(torch.full_like(x, float("nan")))  # a validation forward between backward and step
        model.train()
        opt.step()
    (record,) = w.activations["0"]
    assert record.stats.count == 64 * 64 and record.stats.nonfinite == 0


def _hook_count(model, opt=None):
    module_hooks = sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()
    )
    param_hooks = sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())
    opt_hooks = len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks) if opt else 0
    return module_hooks + param_hooks + opt_hooks


def test_every_hook_is_removed_on_exit_and_after_an_exception():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _hook_count(model, opt) == 0
    with hs.watch(model, opt, guard=True) as w:
        assert _hook_count(model, opt) > 0
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    assert _hook_count(model, opt) == 0
    with pytest.raises(ZeroDivisionError), hs.watch(model, opt):
        model(torch.randn(3, 4)).sum().backward()
        _ = 1 / 0
    assert _hook_count(model, opt) == 0
    w.close()  # idempotent
    assert w.step == 1


def test_watching_a_watched_model_is_an_error_until_the_first_closes():
    model = nn.Linear(4, 2)
    with hs.watch(model) as first:
        with pytest.raises(RuntimeError, match="already watched by an open Watch; close that one first"):
            hs.watch(model)
        # the first watch's: the layer's, the step marker's, the protocol checks' (graphs kept alive) and
        # the timing's (the forward ends)
        assert len(model._forward_hooks) == 1 + 1 + 1 + 1
    first.close()
    with hs.watch(model, doctor=False, stats=False, guard=True):
        pass


def test_bad_arguments_are_refused_in_one_line():
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        hs.watch(nn.Linear(2, 2), "adam")
    with pytest.raises(ValueError, match="doctor=True reads the statistics"):
        hs.watch(nn.Linear(2, 2), stats=False)
    with pytest.raises(ValueError, match="every=0"):
        hs.watch(nn.Linear(2, 2), every=0)


def test_report_writes_the_run_folder_and_report(tmp_path):
    torch.manual_seed(0)
    out = tmp_path / "run"
    w = _plain_loop(dead_mlp(), steps=6, path=out)
    config = json.loads((out / "config.json").read_text())
    assert (config["source"], config["status"], config["steps"]) == ("hs.watch", "complete", 6)
    findings = json.loads((out / "findings.json").read_text())
    assert [(f["kind"], f["module"]) for f in findings] == [(f.kind, f.module) for f in w.findings]
    assert {row["layer"] for row in json.loads((out / "stats.json").read_text())} == {"0", "1", "2", "3", "4"}
    assert (out / "figures" / "gradient_flow.png").is_file() and (out / "figures" / "loss.png").is_file()
    assert "100% of units dead" in (out / "report.html").read_text()
    with pytest.raises(hs.staged_folder.RunFolderError, match="already holds"):
        hs.watch(nn.Linear(2, 2), path=out)  # refused before training, as RunFolder does


def test_a_watch_holds_its_run_folder_from_start_to_close(tmp_path):
    """A second writer (another watch, a RunFolder) is refused while the first trains, not at its close."""
    out = tmp_path / "run"
    first = hs.watch(nn.Linear(2, 2), path=out)
    with pytest.raises(hs.staged_folder.RunFolderBusyError, match=f"in use by pid {os.getpid()}"):
        hs.watch(nn.Linear(3, 3), path=out)
    first.close()
    assert json.loads((out / "config.json").read_text())["status"] == "complete"
    assert not list(tmp_path.glob(".*.lock"))  # released: the folder is a finished run now


def _readme_block(marker):
    """The README's python code block that contains ``marker``, as written."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_the_readme_plain_loop_runs_as_written(capsys):
    torch.manual_seed(0)
    exec(_readme_block("with hs.watch(model, opt) as w:"), {"__name__": "readme"})
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "dead_units 2"
    assert "Doctor [warning] dead_units: layer `2` — 100% of units dead since step 0" in err


@pytest.mark.filterwarnings("error::UserWarning")  # hookscope's hooks are not traced: dynamo warns of none
def test_a_compiled_model_is_watched_under_its_own_names():
    model = dead_mlp()
    compiled = torch.compile(model, backend="eager")  # dynamo runs the hooks; no inductor build in a test
    w = _plain_loop(compiled, steps=6)
    assert [(f.kind, f.module, f.step) for f in w.findings] == [("dead_units", "3", 0)]
    assert set(w.activations) == {"0", "1", "2", "3", "4"}
    assert _hook_count(model) == 0


def test_a_guard_stop_still_writes_the_report_saying_where_it_stopped(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), LogAct(), nn.Linear(32, 10))
    with pytest.raises(NonFiniteError):
        _plain_loop(model, guard=True, path=tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["status"], config["steps"]) == ("stopped", 0)
    assert config["error"].startswith("NonFiniteError: hs.watch stopped optimizer step 0")
    findings = json.loads((tmp_path / "run" / "findings.json").read_text())
    assert [(f["kind"], f["module"]) for f in findings] == [("nonfinite", "1")]


def test_after_check_listeners_get_the_new_findings_of_each_check_and_the_final_one():
    torch.manual_seed(0)
    model = dead_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checks = []
    with hs.watch(model, opt, quiet=True, check_every=3) as w:
        w.after_check.append(lambda new: checks.append((w.step, [(f.kind, f.module) for f in new])))
        for x, y in list(digits_flat().train)[:7]:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    # the rules ran after steps 3 and 5 (every 3 steps, and at the end of the 5-step warm-up, whence the
    # count starts again; the step count is raised just after the check) and at close
    assert checks == [(2, [("dead_units", "3")]), (4, []), (7, [])]
    silent = hs.watch(nn.Linear(2, 2), stats=False, doctor=False, guard=True)
    silent.after_check.append(checks.append)
    silent.close()
    assert len(checks) == 3  # without statistics no check runs, and no listener is called


def _hand_written_sgd(model, steps=8, lr=10.0):
    """The loop of the PyTorch examples' word language model: no optimizer object, the update by hand
    inside ``w.optimizer_step()``."""
    loss_func = nn.CrossEntropyLoss()
    with hs.watch(model, quiet=True, check_every=3) as w:
        for x, y in digits_flat().train:
            if w.step >= steps:
                break
            model.zero_grad()
            loss = loss_func(model(x), y)
            w.log(loss)
            loss.backward()
            with w.optimizer_step():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
    return w


def test_a_hand_written_update_is_an_optimizer_step_with_the_same_diagnosis():
    torch.manual_seed(0)
    expected = _plain_loop(mlp(depth=3), steps=8, lr=10.0, opt_func=torch.optim.SGD)
    torch.manual_seed(0)
    w = _hand_written_sgd(mlp(depth=3))
    assert w.step == expected.step == 8
    found = {(f.kind, f.module, f.step) for f in w.findings}
    assert {("loss_divergence", "", 3), ("exploding_gradient", "3", 4)} <= found  # lr 1000x too high
    assert found == {(f.kind, f.module, f.step) for f in expected.findings}
    assert w.param_history["4.weight"][0].update_ratio > 0  # the update, measured across the block


def test_optimizer_step_counts_nothing_when_its_body_raises_and_is_refused_with_an_optimizer():
    model = mlp(depth=2)
    with hs.watch(model, quiet=True) as w:
        nn.functional.cross_entropy(model(torch.randn(4, 64)), torch.tensor([0, 1, 2, 3])).backward()
        with pytest.raises(ValueError, match="a failed update"), w.optimizer_step():
            raise ValueError("a failed update")
        assert w.step == 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    refused = pytest.raises(RuntimeError, match=r"follows SGD.step\(\) already; remove the with-block")
    with hs.watch(model, opt, quiet=True) as w, refused, w.optimizer_step():
        pass
