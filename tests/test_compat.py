"""Compatibility, both ways: with torch, and with hookscope's own earlier names.

- Each wrapper in hookscope.compat does what the torch call it wraps does (run on every torch upgrade).
- Every deprecated alias (a renamed keyword, a moved name or module, a renamed attribute or method) warns
  exactly once per use with a ``DeprecationWarning`` naming the new spelling, and still does what the new
  spelling does. ``test_every_deprecation_in_the_source_is_covered_here`` keeps this list complete.
"""

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope import compat
from hookscope.callbacks.lr_finder import sweeping
from hookscope.doctor.engine import Engine
from hookscope.hooks.capture import Capture
from hookscope.pruning.importance import activation_importance, importance
from hookscope.run_reader import read_metrics
from hookscope.train.events import CancelFitException
from hookscope.watching import Watch


def test_torch_dispatch_mode_sees_every_aten_op():
    seen = []

    class Spy(compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Spy():
        out = torch.ones(3).log().sum()
    assert out.item() == 0
    assert "aten.log" in seen and "aten.sum" in seen


def test_foreach_norm_is_the_norm_of_each_tensor():
    tensors = [torch.tensor([3.0, 4.0]), torch.ones(4, dtype=torch.float64), torch.tensor([-2.0, 1.0])]
    norms = compat.foreach_norm(tensors)
    assert [n.dtype for n in norms] == [torch.float32, torch.float64, torch.float32]
    assert [n.item() for n in norms] == [5.0, 2.0, torch.linalg.vector_norm(tensors[2]).item()]
    assert [n.item() for n in compat.foreach_norm(tensors, 1)] == [7.0, 4.0, 3.0]
    assert compat.foreach_norm([torch.tensor([float("nan")])])[0].isnan()


def test_foreach_copy_and_sub_work_in_place():
    dst = [torch.zeros(2), torch.zeros(3)]
    src = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])]
    first = dst[0]
    compat.foreach_copy_(dst, src)
    assert dst[0] is first and torch.equal(dst[0], src[0]) and torch.equal(dst[1], src[1])
    compat.foreach_sub_(dst, [torch.ones(2), torch.ones(3)])
    assert dst[0].tolist() == [0.0, 1.0] and dst[1].tolist() == [2.0, 3.0, 4.0]


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # torch's note on building a sparse tensor
def test_flag_non_finite_sets_the_flag_for_a_nan_or_inf_and_leaves_the_values_and_their_versions():
    one = torch.ones(())
    tensors = [torch.tensor([1.0, -2.0]), torch.tensor([3.0], dtype=torch.float16)]
    versions = [compat.tensor_version(t) for t in tensors]
    found = torch.zeros(())
    assert compat.flag_non_finite_(tensors, found, one) and found.item() == 0.0
    assert tensors[0].tolist() == [1.0, -2.0] and tensors[1].tolist() == [3.0]
    assert [compat.tensor_version(t) for t in tensors] == versions
    tensors[1][0] = float("inf")
    assert compat.flag_non_finite_(tensors, found, one) and found.item() == 1.0
    sparse = torch.sparse_coo_tensor([[0]], [float("nan")], (2,))
    found.zero_()
    assert not compat.flag_non_finite_([sparse], found, one) and found.item() == 0.0


@pytest.mark.parametrize("make", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.Adagrad])
def test_a_fused_optimizer_handed_a_set_flag_changes_neither_its_parameters_nor_its_state(make):
    param = nn.Parameter(torch.ones(3))
    opt = make([param], lr=0.1, fused=True)
    assert compat.skips_steps_on_device(opt) and not compat.skips_steps_on_device(make([param], lr=0.1))
    param.grad = torch.ones(3)
    opt.step()  # a first step: the state exists
    before = (param.detach().clone(), {k: v.clone() for k, v in opt.state[param].items()})
    compat.skip_step_if(opt, torch.ones(()))
    opt.step()
    assert torch.equal(param, before[0])
    assert all(torch.equal(v, before[1][k]) for k, v in opt.state[param].items())
    compat.skip_step_if(opt, None)
    assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")
    opt.step()
    assert not torch.equal(param, before[0])


def test_hook_dict_of_follows_registration_and_owner_lifetime():
    module = nn.Linear(2, 2)
    handle = module.register_forward_hook(lambda *args: None)
    hooks = compat.hook_dict_of(handle)
    assert hooks is module._forward_hooks and handle.id in hooks
    handle.remove()
    assert handle.id not in compat.hook_dict_of(handle)

    tensor = torch.ones(1, requires_grad=True) * 2
    tensor_handle = tensor.register_hook(lambda g: None)
    assert tensor_handle.id in compat.hook_dict_of(tensor_handle)
    del tensor
    assert compat.hook_dict_of(tensor_handle) is None  # the tensor (and its hooks dict) is gone


def test_tensor_version_counts_in_place_writes_also_through_views():
    t = torch.zeros(4)
    before = compat.tensor_version(t)
    t.add_(1)
    assert compat.tensor_version(t) == before + 1
    t[:2].mul_(3)
    assert compat.tensor_version(t) > before + 1
    written = compat.tensor_version(t)
    u = t + 1
    assert compat.tensor_version(t) == written  # out-of-place ops leave it
    assert compat.tensor_version(u) == t.add(1)._version


def test_uncompiled_modules_are_not_compiled():
    model = nn.Linear(2, 2)
    assert not compat.is_compile_wrapper(model)
    assert not compat.is_compiled_in_place(model)
    assert not compat.is_compiled_module(model)
    assert compat.uncompiled(model) is model
    assert compat.compile_in_use() == ("torch._dynamo.eval_frame" in sys.modules)


def test_compile_markers_of_both_forms_of_torch_compile():
    # torch.compile only wraps here: nothing is compiled until the first call, which these tests never make
    model = nn.Linear(2, 2)
    wrapper = torch.compile(model)
    assert compat.compile_in_use()
    assert compat.is_compile_wrapper(wrapper) and compat.is_compiled_module(wrapper)
    assert not compat.is_compiled_in_place(wrapper)
    assert compat.uncompiled(wrapper) is model
    assert getattr(wrapper, compat.ORIGINAL_MODULE_ATTR) is model
    assert not compat.is_compiled_module(model)

    in_place = nn.Linear(2, 2)
    in_place.compile()
    assert compat.is_compiled_in_place(in_place) and compat.is_compiled_module(in_place)
    assert not compat.is_compile_wrapper(in_place)
    assert compat.uncompiled(in_place) is in_place


# ------------------------------------------------------------------------- hookscope's deprecated aliases


def _once(use, at_caller: bool = True):
    """``use()`` run with every warning recorded; returns its value and the one DeprecationWarning, which
    points at the line that used the old name (``at_caller``; an import's warning points at importlib)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = use()
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in deprecations]
    assert deprecations[0].filename == __file__ or not at_caller
    return value, str(deprecations[0].message)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_spec_is_the_former_name_of_select():
    model = _net()
    names, message = _once(lambda: hs.select(model, spec=nn.Linear))
    assert [n for n, _ in names] == ["0", "2"] and "spec= is now select=" in message
    with _once(lambda: hs.capture(model, spec="2"))[0] as cap:
        model(torch.ones(1, 4))
    assert cap.names == ("2",)
    with _once(lambda: Capture(model, spec=["0"]))[0] as cap:
        model(torch.ones(1, 4))
    assert cap.names == ("0",)
    table, _ = _once(lambda: hs.sparsity(model, spec="0"))
    assert [r.name for r in table.rows] == ["0"]
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
    ablation, _ = _once(lambda: hs.ablate(model, spec=nn.ReLU, data=data))
    assert [row.name for row in ablation.rows] == ["1"]
    scores, _ = _once(lambda: importance(model, spec="0"))
    assert list(scores) == ["0"]
    scores, _ = _once(lambda: activation_importance(model, spec="1", data=data))
    assert list(scores) == ["1"]
    pruned, _ = _once(lambda: hs.prune(model, spec="0", amount=0.5))
    assert pruned["0"] == 0.5
    pruning, _ = _once(lambda: hs.callbacks.Pruning(spec="2", final_sparsity=0.5))
    assert pruning.select == "2"
    with pytest.raises(TypeError, match="spec= and select= both given"):
        hs.select(model, spec=nn.Linear, select=nn.ReLU)


def test_the_output_folder_keywords_are_now_path(tmp_path):
    checkpoint, message = _once(lambda: hs.callbacks.Checkpoint(dir=tmp_path / "c"))
    assert checkpoint.dir == tmp_path / "c" and "dir= is now path=" in message
    logger, _ = _once(lambda: hs.callbacks.MetricsLogger(folder=tmp_path / "m"))
    assert logger.folder == tmp_path / "m"
    logger, _ = _once(lambda: hs.callbacks.CSVLogger(folder=tmp_path / "c"))
    assert logger.folder == tmp_path / "c"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "metrics.jsonl").write_text('{"epoch": 0}\n')
    rows, _ = _once(lambda: read_metrics(folder=tmp_path / "m"))
    assert rows == [{"epoch": 0}]
    page, _ = _once(lambda: hs.viz.write_report(run_dir=tmp_path / "m"))
    assert page == tmp_path / "m" / "report.html" and page.is_file()
    model = _net()
    with _once(lambda: Watch(model, quiet=True, report=tmp_path / "w"))[0] as w:
        model(torch.ones(1, 4)).sum().backward()
    assert w.report_path == tmp_path / "w" and (tmp_path / "w" / "report.html").is_file()


def test_find_nonfinite_loss_fn_is_now_loss_func():
    model = _net()
    x, y = torch.ones(2, 4), torch.tensor([0, 1])
    log_of_zero = lambda pred, target: (pred * 0).log().sum()  # noqa: E731
    report, message = _once(lambda: hs.find_nonfinite(model, x, target=y, loss_fn=log_of_zero))
    assert (report.phase, report.module, report.op) == ("forward", "loss_fn", "aten.log")
    assert "loss_func=" in message


MOVED_FROM_THE_TOP = {
    "Ablation": "hookscope.hooks.ablate",
    "CallbackOrderError": "hookscope.train.callback",
    "CancelBackwardException": "hookscope.train.events",
    "CancelBatchException": "hookscope.train.events",
    "CancelEpochException": "hookscope.train.events",
    "CancelFitException": "hookscope.train.events",
    "CancelStepException": "hookscope.train.events",
    "CancelTrainException": "hookscope.train.events",
    "CancelValidException": "hookscope.train.events",
    "Capture": "hookscope.hooks.capture",
    "CaptureLimitError": "hookscope.hooks.capture",
    "CheckpointError": "hookscope.train.checkpoint",
    "CompactReport": "hookscope.pruning.compact",
    "Finding": "hookscope.doctor.findings",
    "HookSet": "hookscope.hooks.handles",
    "NonFiniteError": "hookscope.watching",
    "NonFiniteReport": "hookscope.hooks.nonfinite",
    "Patch": "hookscope.hooks.patch",
    "Record": "hookscope.hooks.capture",
    "RunningStats": "hookscope.hooks.stats",
    "SelectionError": "hookscope.hooks.select",
    "Sparsity": "hookscope.pruning.masks",
    "Summary": "hookscope.hooks.summary",
    "SummaryRow": "hookscope.hooks.summary",
    "TensorStats": "hookscope.hooks.stats",
    "Watch": "hookscope.watching",
}

MOVED_NAMES = {
    **{("hookscope", name): home for name, home in MOVED_FROM_THE_TOP.items()},
    ("hookscope.viz.feature_maps", "save_figure"): "hookscope.viz.save",
    ("hookscope.callbacks.schedule", "Schedule"): ("hookscope.callbacks.schedule", "Annealer"),
    ("hookscope.doctor.schedule", "Schedule"): ("hookscope.doctor.schedule", "RecordingSchedule"),
    ("hookscope.callbacks.recorder", "Recorder"): "hookscope.train.recorder",
    ("hookscope.callbacks.loggers.metrics", "read_metrics"): "hookscope.run_reader",
    **{
        ("hookscope.doctor.records", name): f"hookscope.doctor.{home}"
        for name, home in {
            "StepStats": "record_types",
            "ParamRecord": "record_types",
            "with_parameters": "selection",
            "computing_leaves": "selection",
            "module_in_training": "selection",
            "RESHAPES": "selection",
            "TrainingOf": "selection",
            "ActivationRecorder": "recorders",
            "GradientRecorder": "recorders",
            "LayerRecorder": "recorders",
            "thin_if_full": "recorders",
            "SAVED_RECORDS": "history_codec",
            "history_state": "history_codec",
            "thin_factor": "history_codec",
            "thinned": "history_codec",
        }.items()
    },
}


@pytest.mark.parametrize(
    ("old", "new"), MOVED_NAMES.items(), ids=lambda v: ".".join(v) if isinstance(v, tuple) else v
)
def test_a_moved_name_is_found_at_its_old_path_with_a_warning(old, new):
    module, name = old
    home, new_name = new if isinstance(new, tuple) else (new, name)
    value, message = _once(lambda: getattr(importlib.import_module(module), name))
    assert value is getattr(importlib.import_module(home), new_name)
    assert new_name in message


def test_the_moved_names_leave_the_top_level_listing():
    assert not set(MOVED_FROM_THE_TOP) & (set(hs.__all__) | set(dir(hs)))
    assert len(hs.__all__) <= 26


def test_from_import_of_a_moved_top_level_name_still_works():
    with pytest.warns(DeprecationWarning, match="hookscope.train.events.CancelFitException"):
        from hookscope import CancelFitException as old
    assert old is CancelFitException


def test_a_moved_module_imports_with_a_warning():
    sys.modules.pop("hookscope.callbacks.monitor", None)
    module, message = _once(lambda: importlib.import_module("hookscope.callbacks.monitor"), at_caller=False)
    assert module.ActivationStats is hs.callbacks.ActivationStats and "layer_stats" in message


def test_renamed_methods_and_attributes_still_answer():
    engine = Engine(quiet=True)
    added, message = _once(lambda: engine.report([]))
    assert added == [] and "add_findings" in message
    text, message = _once(lambda: engine.summary())
    assert text == engine.describe() and "describe" in message
    interval, message = _once(lambda: hs.callbacks.ActivationStats(every=4).stride)
    assert interval == 4 and ".every" in message
    learn = hs.Learner(
        _net(),
        (
            torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.ones(2, 4), torch.tensor([0, 1]))
            ),
            None,
        ),
        nn.CrossEntropyLoss(),
        progress=False,
    )
    sweeping_now, message = _once(lambda: sweeping(learn))
    assert sweeping_now is False and "run_during_sweep" in message


def test_every_deprecation_in_the_source_is_covered_here():
    """A new DeprecationWarning in src/ names a module this file tests; add its alias above."""
    covered = {
        "_deprecation.py",  # the helpers, used by the aliases above
        "_lazy.py",
        "doctor/records.py",
        "doctor/schedule.py",
        "doctor/engine.py",
        "hooks/nonfinite.py",
        "callbacks/monitor.py",
        "callbacks/lr_finder.py",
        "callbacks/layer_stats.py",
        "callbacks/recorder.py",
    }
    src = Path(hs.__file__).parent
    warning = {str(p.relative_to(src)) for p in src.rglob("*.py") if "DeprecationWarning" in p.read_text()}
    assert warning <= covered, warning - covered
    helper_users = {
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if re.search(r"renamed_keywords\(|moved_names\(|deprecated\(", p.read_text())
    }
    assert helper_users == {
        "_deprecation.py",
        "_lazy.py",
        "hooks/select.py",
        "hooks/capture.py",
        "hooks/ablate.py",
        "pruning/masks.py",
        "pruning/importance.py",
        "callbacks/pruning.py",
        "callbacks/checkpoint.py",
        "callbacks/loggers/metrics.py",
        "callbacks/schedule.py",
        "run_reader.py",
        "viz/report.py",
        "viz/feature_maps.py",
        "watching.py",
    }


def test_graph_task_id_is_shared_by_one_backward_and_minus_one_outside() -> None:
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    seen: list[int] = []
    for p in (a, b):
        p.register_post_accumulate_grad_hook(lambda _: seen.append(compat.graph_task_id()))
    (a * b).sum().backward()
    (a * b).sum().backward()
    assert seen[0] == seen[1] != seen[2] == seen[3]
    assert compat.graph_task_id() == -1
