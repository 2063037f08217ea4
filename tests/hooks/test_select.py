import pytest
import torch
from torch import nn

import hookscope as hs
from hookscope.hooks.select import SelectionError


def _net() -> nn.Module:
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    return nn.Sequential(block, nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU()), nn.Flatten(), nn.Linear(4, 2))


def test_by_type_in_model_order():
    assert [name for name, _ in hs.select(_net(), nn.Conv2d)] == ["0.0", "1.0"]


def test_tuple_of_types():
    assert [name for name, _ in hs.select(_net(), (nn.ReLU, nn.Linear))] == ["0.2", "1.1", "3"]


def test_glob_crosses_dots():
    assert [name for name, _ in hs.select(_net(), "*.0")] == ["0.0", "1.0"]
    assert [name for name, _ in hs.select(_net(), "1*")] == ["1", "1.0", "1.1"]


def test_list_of_names_keeps_model_order():
    assert [name for name, _ in hs.select(_net(), ["3", "0.1"])] == ["0.1", "3"]


def test_predicate():
    spec = lambda name, m: isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)  # noqa: E731
    assert [name for name, _ in hs.select(_net(), spec)] == ["1.0"]


def test_none_means_leaf_modules():
    assert [name for name, _ in hs.select(_net())] == ["0.0", "0.1", "0.2", "1.0", "1.1", "2", "3"]


def test_bare_leaf_model_selects_itself():
    layer = nn.Linear(2, 2)
    assert hs.select(layer) == [("", layer)]


def test_shared_module_listed_once():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    assert [name for name, _ in hs.select(model, nn.ReLU)] == ["1"]


def test_resnet_glob(resnet34_eval):
    names = [name for name, _ in hs.select(resnet34_eval, "layer1.*.conv*")]
    assert names == [f"layer1.{b}.conv{c}" for b in range(3) for c in (1, 2)]
    assert len(hs.select(resnet34_eval, nn.Conv2d)) == 36


def test_no_match_lists_closest_names():
    with pytest.raises(SelectionError, match=r"closest names: .*0\.1") as info:
        hs.select(_net(), "0.11")
    assert "\n" not in str(info.value)


def test_no_match_by_type_lists_types_present():
    with pytest.raises(SelectionError, match=r"Conv1d.*types present: .*Conv2d"):
        hs.select(_net(), nn.Conv1d)


def test_missing_names_in_a_list_are_named():
    with pytest.raises(SelectionError, match="closest names: 3"):
        hs.select(_net(), ["33"])


def test_unsupported_spec_is_a_type_error():
    with pytest.raises(TypeError, match="unsupported selection spec 3"):
        hs.select(_net(), 3)
    model = _net()
    with pytest.raises(TypeError, match=r"module instance .*qualified name"):
        hs.select(model, model[3])


def test_selection_does_not_run_the_model():
    model = _net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hs.select(model, nn.BatchNorm2d)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
