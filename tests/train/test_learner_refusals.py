"""Training that cannot learn is refused with one line naming what was given and the fix — or, for data
that trains but teaches nothing, reported by hs.diagnose — before a single step changes the weights."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs


def _loader(n, y=None, batch_size=4, drop_last=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g) if y is None else y
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=drop_last)


def _learner(train, loss_func=None, cbs=()):
    torch.manual_seed(0)
    loss_func = nn.CrossEntropyLoss() if loss_func is None else loss_func
    return hs.Learner(nn.Linear(4, 2), (train, _loader(8)), loss_func, cbs=list(cbs), progress=False)


def _weights(learn):
    return [p.detach().clone() for p in learn.model.parameters()]


def _unchanged(learn, before):
    return all(torch.equal(a, b) for a, b in zip(before, _weights(learn), strict=True))


class _Fired(hs.Callback):
    def __init__(self):
        self.events = []

    def before_fit(self):
        self.events.append("before_fit")


def test_fit_refuses_an_empty_training_loader_before_any_event():
    fired = _Fired()
    learn = _learner(_loader(0), cbs=[fired])
    before = _weights(learn)
    with pytest.raises(ValueError) as err:
        learn.fit(1)
    assert str(err.value) == (
        "Learner.fit: the training loader yields no batch: its TensorDataset holds 0 samples; "
        "give it a non-empty dataset"
    )
    assert fired.events == [] and learn.opt is None and _unchanged(learn, before)


def test_fit_names_drop_last_when_it_drops_the_only_batch():
    learn = _learner(_loader(3, batch_size=4, drop_last=True))
    with pytest.raises(ValueError, match=r"^Learner.fit: .*its 3 samples are fewer than batch_size=4 and "
                       r"drop_last=True drops them; lower batch_size or set drop_last=False$"):  # fmt: skip
        learn.fit(1)


def test_lr_find_refuses_an_empty_training_loader_instead_of_dividing_by_zero():
    learn = _learner(_loader(0))
    before = _weights(learn)
    with pytest.raises(ValueError, match=r"^Learner.lr_find: the training loader yields no batch: its "
                       r"TensorDataset holds 0 samples; give it a non-empty dataset$"):  # fmt: skip
        learn.lr_find()
    assert _unchanged(learn, before)


def test_diagnose_refuses_empty_data():
    with pytest.raises(ValueError, match=r"^diagnose: the training loader yields no batch: its TensorDataset "
                       r"holds 0 samples"):  # fmt: skip
        hs.diagnose(nn.Linear(4, 2), _loader(0), loss_func=nn.CrossEntropyLoss(), quiet=True)


def test_diagnose_reports_targets_that_are_all_one_class():
    one_class = _loader(16, y=torch.zeros(16, dtype=torch.long))
    findings = hs.diagnose(nn.Linear(4, 2), one_class, steps=6, loss_func=nn.CrossEntropyLoss(), quiet=True)
    (label,) = [f for f in findings if f.kind == "label_problem"]
    assert (label.module, label.severity, label.evidence) == ("", "error", {"class": 0, "batches": 6})
    assert label.message.startswith(
        "all targets are class 0 in the 6 training batch(es) seen: the loss can reach 0 without learning "
        "anything."
    )
    two_classes = hs.diagnose(
        nn.Linear(4, 2), _loader(16), steps=6, loss_func=nn.CrossEntropyLoss(), quiet=True
    )
    assert "label_problem" not in [f.kind for f in two_classes]


def _float_loss(pred, target):
    return nn.functional.cross_entropy(pred, target).item()


def test_a_loss_that_is_not_a_tensor_is_a_type_error_at_the_first_batch():
    learn = _learner(_loader(8), loss_func=_float_loss)
    before = _weights(learn)
    with pytest.raises(TypeError) as err:
        learn.fit(1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("Learner: loss_func _float_loss returned float (")
    assert "not a torch.Tensor" in message and "F.cross_entropy(pred, target)" in message
    assert learn.iter == 0 and learn.training_step == 0 and _unchanged(learn, before)


def test_a_model_on_the_meta_device_is_refused_at_creation():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.raises(ValueError) as err:
        hs.Learner(model, (_loader(8), None), nn.CrossEntropyLoss(), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "Learner: 9 parameter(s)/buffer(s) of Sequential are on the meta device (shapes, no values): "
        "0.weight, 0.bias, 1.weight, 1.bias, 2.weight and 4 more; "
    )
    assert "model.to_empty(device=" in message and "load_state_dict" in message
