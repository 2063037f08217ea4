import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import hookscope as hs
from hookscope.hooks.capture import CaptureLimitError
from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import SelectionError


def test_resnet34_conv_outputs_match_the_seed(resnet34_eval, china_224):
    model, x = resnet34_eval, china_224
    with torch.no_grad(), hs.capture(model, nn.Conv2d) as cap:
        model(x)
    with torch.no_grad():
        first_conv = model.conv1(x)
    assert len(cap.outputs) == 36
    assert cap.outputs[0].shape == (1, 64, 112, 112)
    assert torch.equal(cap.outputs[0], first_conv)
    assert [r.name for r in cap.records][:3] == ["conv1", "layer1.0.conv1", "layer1.0.conv2"]


def test_bn1_output_survives_the_inplace_relu(resnet34_eval, china_64):
    model, x = resnet34_eval, china_64
    with torch.no_grad(), hs.capture(model, "bn1") as cap:
        model(x)
    with torch.no_grad():
        expected = model.bn1(model.conv1(x))
    assert len(cap) == 1
    assert cap["bn1"].min().item() < 0
    assert torch.equal(cap["bn1"], expected)


def test_input_of_inplace_relu_is_captured_before_it_is_overwritten(resnet34_eval, china_64):
    model, x = resnet34_eval, china_64
    with torch.no_grad(), hs.capture(model, "relu", what="input") as cap:
        model(x)
    with torch.no_grad():
        expected = model.bn1(model.conv1(x))
    assert len(cap) == 1
    assert torch.equal(cap["relu"], expected)
    assert cap["relu"].min().item() < 0


def test_module_called_twice_keeps_both_calls(resnet34_eval, china_64):
    model, x = resnet34_eval, china_64
    with torch.no_grad(), hs.capture(model, "layer1.0.relu") as cap:
        model(x)
    calls = cap.calls("layer1.0.relu")
    assert len(calls) == 2
    assert [r.call for r in cap.records] == [0, 1]
    assert not torch.equal(calls[0], calls[1])
    assert cap["layer1.0.relu"] is calls[1]


def _resnet_forward_from_bn1(model: nn.Module, bn1_out: torch.Tensor) -> torch.Tensor:
    h = model.maxpool(torch.relu(bn1_out))
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        h = layer(h)
    return model.fc(torch.flatten(model.avgpool(h), 1))


def test_bn1_grad_output_equals_autograd(resnet18_eval, china_64):
    model, x = resnet18_eval, china_64  # small: two backward passes through a ResNet18
    target = torch.tensor([3])
    bn1_out = model.bn1(model.conv1(x))
    loss = nn.functional.cross_entropy(_resnet_forward_from_bn1(model, bn1_out), target)
    (expected,) = torch.autograd.grad(loss, bn1_out)

    with hs.capture(model, "bn1", what="grad_output") as cap:
        nn.functional.cross_entropy(model(x), target).backward()
    model.zero_grad(set_to_none=True)
    assert cap["bn1"].shape == (1, 64, 32, 32)
    torch.testing.assert_close(cap["bn1"], expected)
    assert not torch.equal(cap["bn1"], torch.zeros_like(expected))


def test_grad_input_equals_autograd_of_the_input():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.randn(5, 3, requires_grad=True)
    with hs.capture(model, ["0", "2"], what=("grad_input", "grad_output")) as cap:
        model(x).pow(2).sum().backward()
    (expected_x,) = torch.autograd.grad(model(x).pow(2).sum(), x)
    torch.testing.assert_close(cap["0", "grad_input"], expected_x)
    torch.testing.assert_close(cap["2", "grad_output"], 2 * model(x).detach())
    # backward visits the last layer first
    assert [(r.name, r.kind) for r in cap.records][:2] == [("2", "grad_output"), ("2", "grad_input")]


def test_grad_input_of_an_inplace_module_is_the_gradient_of_what_it_received():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    x = torch.randn(8, 3)
    hidden = model[0](x)
    (expected,) = torch.autograd.grad(model[2](torch.relu(hidden)).sum(), hidden)
    with hs.capture(model, "1", what="grad_input") as cap:
        model(x).sum().backward()
    torch.testing.assert_close(cap["1"], expected)
    assert (cap["1"][hidden < 0] == 0).all() and (cap["1"] != 0).any()


def test_records_follow_firing_order_for_several_kinds():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    with hs.capture(model, what=("input", "output")) as cap:
        model(torch.ones(1, 3))
    assert [(r.name, r.kind) for r in cap.records] == [
        ("0", "input"),
        ("0", "output"),
        ("1", "input"),
        ("1", "output"),
    ]
    assert torch.equal(cap["1", "input"], cap["0", "output"])
    with pytest.raises(KeyError, match=r"cap\['0', 'input'\]"):
        cap["0"]


def test_mode_and_outputs_are_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Dropout(0.0))
    x = torch.randn(6, 4)
    model.train()
    expected = model(x)
    with hs.capture(model, what=("input", "output", "grad_output")) as cap:
        got = model(x)
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(got, expected)
    assert len(cap) == 8
    model.eval()
    with hs.capture(model):
        model(x)
    assert not model.training


def test_to_cpu_and_reduce(resnet18_eval, china_64):
    model, x = resnet18_eval, china_64
    channel_mean = lambda t: t.mean(dim=(2, 3))  # noqa: E731
    with torch.no_grad(), hs.capture(model, nn.Conv2d, to="cpu", reduce=channel_mean) as cap:
        model(x)
    with torch.no_grad():
        expected = model.conv1(x).mean(dim=(2, 3))
    assert cap["conv1"].shape == (1, 64) and cap["conv1"].device.type == "cpu"
    torch.testing.assert_close(cap["conv1"], expected)
    assert len(cap) == 20


def test_to_cpu_from_cpu_is_still_a_copy():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    with torch.no_grad():
        model[0].weight.copy_(-torch.eye(2))
        model[0].bias.zero_()
    with torch.no_grad(), hs.capture(model, "0", to="cpu") as cap:
        model(torch.tensor([[1.0, 2.0]]))
    assert cap["0"].tolist() == [[-1.0, -2.0]]


def test_reduce_may_return_anything():
    model = nn.Sequential(nn.Linear(2, 3))
    with hs.capture(model, reduce=lambda t: tuple(t.shape)) as cap:
        model(torch.zeros(5, 2))
    assert cap["0"] == (5, 3) and cap.nbytes == 0


def test_inputs_with_keyword_arguments():
    class Scale(nn.Module):
        def forward(self, x, factor=1.0, *, bias):
            return x * factor + bias

    model = nn.Sequential()
    model.add_module("scale", Scale())
    with hs.capture(model, "scale", what="input") as cap:
        model.scale(torch.ones(2), 3.0, bias=torch.zeros(2))
    x, factor, kwargs = cap["scale"]
    assert x.tolist() == [1.0, 1.0] and factor == 3.0 and kwargs["bias"].tolist() == [0.0, 0.0]


def test_user_hooks_survive_and_nested_captures_both_record():
    model = nn.Sequential(nn.Linear(2, 2))
    seen = []
    handle = model[0].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    with hs.capture(model) as outer:
        with hs.capture(model, what="input") as inner:
            model(torch.zeros(1, 2))
        model(torch.zeros(1, 2))
    assert len(outer) == 2 and len(inner) == 1
    assert len(model[0]._forward_hooks) == 1
    model(torch.zeros(1, 2))
    assert len(seen) == 3
    handle.remove()


def test_reduce_returning_a_view_is_still_a_copy():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    with torch.no_grad():
        model[0].weight.copy_(-torch.eye(2))
        model[0].bias.zero_()
    with torch.no_grad(), hs.capture(model, "0", reduce=lambda t: t[0]) as cap:
        model(torch.tensor([[1.0, 2.0]]))
    assert cap["0"].tolist() == [-1.0, -2.0]


def test_nested_outputs_keep_their_structure():
    class TwoHeads(nn.Module):
        def forward(self, x):
            return {"pos": x.relu(), "pair": (x, -x)}

    lstm = nn.LSTM(3, 5, batch_first=True)
    model = nn.ModuleDict({"heads": TwoHeads(), "lstm": lstm})
    with hs.capture(model, ["heads", "lstm"]) as cap:
        out = model["heads"](torch.tensor([[-1.0, 2.0]]))
        model["lstm"](torch.zeros(2, 4, 3))
    assert cap["heads"]["pos"].tolist() == [[0.0, 2.0]]
    assert cap["heads"]["pair"][1].tolist() == [[1.0, -2.0]]
    assert cap["heads"]["pos"] is not out["pos"]
    seq, (h, c) = cap["lstm"]
    assert seq.shape == (2, 4, 5) and h.shape == (1, 2, 5) and c.shape == (1, 2, 5)


def test_dataclass_and_ordered_dict_outputs_are_copied_and_keep_their_types():
    from collections import OrderedDict
    from dataclasses import dataclass

    @dataclass
    class Out:  # the shape of a Hugging Face ModelOutput without the dependency
        logits: torch.Tensor
        note: str = "kept"

    class Heads(nn.Module):
        def forward(self, x):
            return Out(x * 2), OrderedDict(h=x * 3)

    model = nn.Sequential(Heads())
    with hs.capture(model, "0") as cap:
        out, hidden = model(torch.ones(1, 2))
        out.logits.zero_()  # an in-place change after the hook must not reach the record
        hidden["h"].zero_()
    kept_out, kept_hidden = cap["0"]
    assert type(kept_out) is Out and kept_out.note == "kept" and kept_out.logits.tolist() == [[2.0, 2.0]]
    assert type(kept_hidden) is OrderedDict and kept_hidden["h"].tolist() == [[3.0, 3.0]]
    assert cap.nbytes == 2 * 2 * 4


def test_grads_of_a_module_with_several_outputs():
    class Split(nn.Module):
        def forward(self, x):
            return x * 2, x * 3

    model = nn.Sequential(Split())
    x = torch.ones(2, requires_grad=True)
    with hs.capture(model, "0", what="grad_output") as cap:
        a, _unused = model(x)
        a.sum().backward()
    (grads,) = cap.calls("0")
    assert grads[0].tolist() == [1.0, 1.0] and grads[1] is None


def test_recursive_module_pairs_each_output_with_its_own_call():
    class Countdown(nn.Module):
        def forward(self, x, depth=2):
            return x if depth == 0 else self(x + 1, depth - 1) * 10

    model = nn.Sequential(Countdown())
    with hs.capture(model, "0", what=("input", "output")) as cap:
        model(torch.zeros(1))
    outputs = {r.call: r.value.item() for r in cap.records if r.kind == "output"}
    assert outputs == {0: 200.0, 1: 20.0, 2: 2.0}
    assert [r.value[0].item() for r in cap.records if r.kind == "input"][1:] == [1.0, 2.0]


def test_calls_accumulate_over_forwards_and_clear_resets():
    model = nn.Sequential(nn.Linear(2, 2))
    with hs.capture(model) as cap:
        model(torch.zeros(1, 2))
        model(torch.ones(1, 2))
        assert len(cap.calls("0")) == 2 and cap.records[-1].call == 1
        cap.clear()
        assert len(cap) == 0 and cap.nbytes == 0
        model(torch.ones(1, 2))
    assert cap.records[0].call == 0


def test_without_with_block_remove_detaches_hooks():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    cap = hs.capture(model)
    model(torch.zeros(1, 2))
    cap.remove()
    cap.remove()
    model(torch.zeros(1, 2))
    assert len(cap) == 2
    assert _hook_count(model) == 0


def test_unknown_name_lists_closest():
    model = nn.Sequential()
    model.add_module("conv1", nn.Conv2d(1, 1, 1))
    model.add_module("conv2", nn.Conv2d(1, 1, 1))
    with hs.capture(model) as cap:
        model(torch.zeros(1, 1, 2, 2))
    with pytest.raises(KeyError, match=r"closest selected names: conv[12], conv[12]"):
        cap["conv"]
    with hs.capture(model, ["conv2", "conv1"]) as cap:
        model[0](torch.zeros(1, 1, 2, 2))
    assert cap.names == ("conv1", "conv2")
    with pytest.raises(KeyError, match="'conv2' is selected but has not run"):
        cap["conv2"]


def test_spec_matching_nothing_is_one_clear_error():
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(SelectionError) as info:
        hs.capture(model, nn.Conv2d)
    assert "Conv2d" in str(info.value) and "Linear" in str(info.value) and "\n" not in str(info.value)
    assert _hook_count(model) == 0


def test_unknown_what_is_one_clear_error():
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"unknown what='outputs'.*'grad_output'") as info:
        hs.capture(model, what="outputs")
    assert "\n" not in str(info.value)
    assert _hook_count(model) == 0


def test_max_bytes_overflow_names_bound_layer_and_fix_and_removes_hooks():
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU())
    x = torch.zeros(4, 10)  # each output: 4 * 10 * 4 = 160 bytes
    with pytest.raises(CaptureLimitError) as info, hs.capture(model, max_bytes=200) as cap:
        model(x)
    message = str(info.value)
    assert "max_bytes=200" in message and "'1'" in message and "reduce=" in message and "\n" not in message
    assert len(cap) == 1 and cap.nbytes == 160
    assert _hook_count(model) == 0
    with hs.capture(model, max_bytes=320) as cap:
        model(x)
    assert cap.nbytes == 320


def test_compiled_model_is_refused_clearly():
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"torch\.compile.*_orig_mod"):
        hs.capture(torch.compile(model))
    inner = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    inner.compile()
    outer = nn.Sequential(inner, nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"module '0' is compiled.*uncompiled model"):
        hs.capture(outer, nn.ReLU)
    wrapped_child = nn.Sequential(torch.compile(nn.Linear(2, 2)), nn.ReLU())
    with pytest.raises(TypeError, match=r"module '0' is compiled"):
        hs.capture(wrapped_child, nn.Linear)
    with hs.capture(outer, "1") as cap:  # a compiled sibling does not matter
        outer[1](torch.ones(1, 2))
    assert len(cap) == 1
    assert all(_hook_count(m) == 0 for m in (model, outer, wrapped_child))


def test_capture_of_the_original_of_a_compiled_model_works_uncompiled():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    compiled = torch.compile(model)
    with hs.capture(compiled._orig_mod, nn.Linear) as cap:
        compiled._orig_mod(torch.ones(1, 2))
    assert cap["0"].shape == (1, 2)


# ---- cleanup, property-tested over random nested models ----------------------------------------------


class Twice(nn.Module):
    """Calls its child twice, like ResNet's reused ReLU."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(self.child(x))


class Residual(nn.Module):
    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(x) + x


class PairOut(nn.Module):
    def forward(self, x):
        return x.tanh(), {"neg": -x}


class TupleBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = PairOut()

    def forward(self, x):
        a, b = self.pair(x)
        return a + b["neg"]


def _blueprints():
    leaf = st.sampled_from(["linear", "relu", "relu_inplace", "tuple"])
    return st.recursive(
        leaf,
        lambda children: st.one_of(
            st.tuples(st.just("seq"), st.lists(children, min_size=1, max_size=3)),
            st.tuples(st.just("twice"), children),
            st.tuples(st.just("residual"), children),
        ),
        max_leaves=8,
    )


def _build(blueprint) -> nn.Module:
    simple = {
        "linear": lambda: nn.Linear(4, 4),
        "relu": nn.ReLU,
        # a Linear first, so the in-place ReLU never overwrites a tensor that backward still needs
        "relu_inplace": lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)),
        "tuple": TupleBlock,
    }
    if isinstance(blueprint, str):
        return simple[blueprint]()
    kind, inner = blueprint
    if kind == "seq":
        return nn.Sequential(*(_build(b) for b in inner))
    return {"twice": Twice, "residual": Residual}[kind](_build(inner))


def _hook_count(model: nn.Module) -> int:
    hook_dicts = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, attr)) for m in model.modules() for attr in hook_dicts)


class Boom(Exception):
    pass


def _exploding_reduce(t):
    raise Boom("inside a hook")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blueprint=_blueprints(),
    spec_choice=st.sampled_from(["none", "linear", "types", "glob", "names", "predicate"]),
    what=st.sampled_from(["output", "input", ("output", "grad_output"), ("grad_input", "grad_output")]),
    failure=st.sampled_from(
        ["none", "in_forward", "before_backward", "after_backward", "in_hook", "max_bytes"]
    ),
    data=st.data(),
)
def test_no_hook_survives_a_capture(blueprint, spec_choice, what, failure, data):
    model = nn.Sequential(nn.Linear(4, 4), _build(blueprint))
    names = [name for name, _ in model.named_modules()][1:]
    spec = {
        "none": None,
        "linear": nn.Linear,
        "types": (nn.ReLU, TupleBlock),
        "glob": "1*",
        "names": data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True)),
        "predicate": lambda name, m: name.count(".") == 1,
    }[spec_choice]
    # a wrong feature size makes the first Linear raise halfway through the forward
    x = torch.randn(3, 5 if failure == "in_forward" else 4, requires_grad=True)
    raw: list[torch.Tensor] = [x]
    with HookSet() as spy:
        for _, module in model.named_modules():
            spy.forward(module, lambda m, args, out: raw.extend(t for t in _tensors(out)))
        try:
            kwargs = {
                "reduce": _exploding_reduce if failure == "in_hook" else None,
                "max_bytes": 1 if failure == "max_bytes" else None,
            }
            with hs.capture(model, spec, what=what, **kwargs):
                out = model(x)
                if failure == "before_backward":
                    raise Boom("in the with-block, gradient hooks still pending")
                out.sum().backward()
                if failure == "after_backward":
                    raise Boom("in the with-block")
        except (Boom, CaptureLimitError, SelectionError) as err:
            assert failure != "none" or isinstance(err, SelectionError)
        except RuntimeError as err:
            assert failure == "in_forward", err
            pass
    assert _hook_count(model) == 0
    assert all(not t._backward_hooks for t in raw)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
