import pytest
import torch
from faults import LogAct, SqrtAbs
from torch import nn

import hookscope as hs


class ParentLog(nn.Module):
    """The NaN comes from the parent's own code between two children."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        return self.b(torch.log(self.a(x)))


class Twice(nn.Module):
    """One module called twice; only the second call sees a negative input."""

    def __init__(self):
        super().__init__()
        self.act = LogAct()

    def forward(self, x):
        return self.act(self.act(x.abs() + 2.0) - 5.0)


def _hook_count(model):
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()
    )


def _data(n=6):
    torch.manual_seed(0)
    return torch.randn(n, 4), torch.randint(0, 3, (n,))


def test_forward_log_names_module_phase_and_op():
    model = nn.Sequential(nn.Linear(4, 8), LogAct(), nn.Linear(8, 3))
    x, y = _data()
    report = hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    assert report.found
    assert (report.phase, report.module, report.module_type, report.op) == (
        "forward",
        "1",
        "LogAct",
        "aten.log",
    )
    assert report.input_shapes == [(6, 8)] and report.output_shapes == [(6, 8)]
    assert report.nan > 0
    assert "`1` (LogAct)" in str(report) and "aten.log" in str(report)
    assert _hook_count(model) == 0


def test_backward_only_sqrt_at_zero_names_backward_node():
    model = nn.Sequential(nn.Linear(4, 8, bias=False), SqrtAbs(), nn.Linear(8, 3))
    x, y = _data()
    x[2] = 0.0
    report = hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    assert (report.phase, report.module, report.module_type) == ("backward", "1", "SqrtAbs")
    assert report.op == "SqrtBackward0"
    assert report.inf > 0
    assert "backward" in str(report) and "SqrtBackward0" in str(report)
    assert _hook_count(model) == 0


def test_forward_only_without_loss_and_healthy_model_reports_nothing():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = _data()
    assert not hs.find_nonfinite(model, x).found
    report = hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    assert not report.found and report.phase is None
    assert str(report).startswith("No NaN or Inf")


def test_non_finite_input_and_target_are_blamed_on_the_data():
    model = nn.Sequential(nn.Linear(4, 3))
    x, _ = _data()
    x[1, 2] = float("inf")
    report = hs.find_nonfinite(model, x)
    assert (report.phase, report.module, report.inf, report.nan) == ("input", "input 0", 1, 0)
    x, _ = _data()
    target = torch.randn(6, 3)
    target[0, 0] = float("nan")
    report = hs.find_nonfinite(model, {"input": x}, nn.MSELoss(), target)
    assert (report.phase, report.module, report.nan) == ("input", "target 0", 1)
    assert "Fix the data" in str(report)


def test_nan_made_by_parent_code_is_blamed_on_the_parent_not_the_next_child():
    model = nn.Sequential(ParentLog())
    with torch.no_grad():
        model[0].a.bias.fill_(-10.0)
    x, y = _data()
    report = hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    assert (report.module, report.module_type, report.op) == ("0", "ParentLog", "aten.log")


def test_second_call_of_a_shared_module_is_named_with_its_call_index():
    model = Twice()
    x, _ = _data()
    report = hs.find_nonfinite(model, x)
    assert (report.module, report.call, report.op) == ("act", 1, "aten.log")
    assert "call 1" in str(report)


def test_nan_made_by_the_loss_function_is_blamed_on_the_loss():
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
    x, y = _data()

    def nll_of_zero(pred, target):
        return -(pred * 0.0).log().mean()

    report = hs.find_nonfinite(model, x, nll_of_zero, y)
    assert (report.phase, report.module, report.op) == ("forward", "loss_fn", "aten.log")
    assert "loss function" in str(report)


def test_model_state_is_left_as_found():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), LogAct(), nn.Linear(8, 3))
    model.train()
    x, y = _data()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    hs.find_nonfinite(model, x, nn.CrossEntropyLoss(), y)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert _hook_count(model) == 0


def test_dropout_replay_reproduces_the_same_random_mask():
    class DropLog(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.log = LogAct()

        def forward(self, x):
            return self.log(self.drop(x.abs() + 1.0) - 1.5)

    model = DropLog().train()
    report = hs.find_nonfinite(model, torch.rand(64, 4))
    assert (report.module, report.op) == ("log", "aten.log")


def test_hooks_are_removed_when_the_forward_raises():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(5, 3))
    x, _ = _data()
    with pytest.raises(RuntimeError):
        hs.find_nonfinite(model, x)
    assert _hook_count(model) == 0


def test_report_to_dict_is_plain():
    model = nn.Sequential(nn.Linear(4, 8), LogAct())
    x, _ = _data()
    d = hs.find_nonfinite(model, x).to_dict()
    assert d["module"] == "1" and d["op"] == "aten.log" and d["output_shapes"] == [(6, 8)]


def test_non_finite_weights_are_blamed_on_the_parameter():
    model = nn.Sequential(nn.Linear(4, 8), nn.Embedding(10, 4))
    with torch.no_grad():
        model[1].weight[3, 0] = float("inf")
    report = hs.find_nonfinite(nn.Sequential(model[1]), torch.tensor([[3, 1]]))
    assert (report.phase, report.module, report.module_type, report.inf) == (
        "parameter",
        "0.weight",
        "Embedding",
        1,
    )
    assert "reload the last good checkpoint" in str(report)


def test_in_place_op_is_named_from_its_finite_input():
    class InplaceLog(nn.Module):
        def forward(self, x):
            return x.clone().log_()

    model = nn.Sequential(nn.Linear(4, 6), InplaceLog())
    x, _ = _data()
    assert hs.find_nonfinite(model, x).op == "aten.log_"


def test_dict_inputs_and_outputs_with_integer_ids():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 2)

        def forward(self, ids, scale=1.0):
            return {"logits": self.head(torch.log(self.emb(ids).exp() * scale)).mean(1)}

    torch.manual_seed(0)
    model = Tagger()
    ids = torch.randint(0, 10, (3, 5))
    report = hs.find_nonfinite(model, {"ids": ids, "scale": -1.0})
    assert (report.module, report.op) == ("", "aten.log")
    assert "the model's own forward code (Tagger" in str(report)
    healthy = hs.find_nonfinite(
        model, {"ids": ids, "scale": 0.5},
        lambda out, y: nn.functional.cross_entropy(out["logits"], y), torch.tensor([0, 1, 0]),
    )  # fmt: skip
    assert not healthy.found


def test_in_place_op_on_a_childs_output_is_blamed_on_the_parent():
    class LogAfterChild(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 6)

        def forward(self, x):
            out = self.a(x)
            return out.log_()  # same tensor object as the child's output, changed in place

    x, _ = _data()
    report = hs.find_nonfinite(nn.Sequential(LogAfterChild()), x)
    assert (report.module, report.module_type, report.op) == ("0", "LogAfterChild", "aten.log_")


def test_compiled_model_is_inspected_eagerly_with_its_own_names():
    model = nn.Sequential(nn.Linear(4, 8), LogAct(), nn.Linear(8, 3))
    compiled = torch.compile(model, backend="eager")
    x, _ = _data()
    report = hs.find_nonfinite(compiled, x)
    assert (report.module, report.op) == ("1", "aten.log")
    assert _hook_count(model) == 0


def test_the_former_keyword_loss_fn_still_works_and_warns():
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=1))
    x, y = _data()

    def nll_of_zero(pred, target):
        return -(pred * 0.0).log().mean()

    with pytest.warns(DeprecationWarning, match="loss_fn= is deprecated.*pass loss_func="):
        report = hs.find_nonfinite(model, x, target=y, loss_fn=nll_of_zero)
    assert (report.phase, report.module, report.op) == ("forward", "loss_fn", "aten.log")
    assert hs.find_nonfinite(model, x, loss_func=nll_of_zero, target=y) == report
    with pytest.raises(TypeError, match="loss_func and loss_fn both given"):
        hs.find_nonfinite(model, x, nll_of_zero, y, loss_fn=nll_of_zero)
