import copy

import pytest
import torch
import torchvision
from torch import nn

from hookscope.hooks.handles import HookSet, SwitchedHooks


def _count(module: nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


def test_registers_and_removes_every_kind_of_hook():
    layer = nn.Linear(2, 2)
    seen = []
    with HookSet() as hooks:
        hooks.forward_pre(layer, lambda m, args: seen.append("pre"))
        hooks.forward(layer, lambda m, args, out: seen.append("fwd"))
        out = layer(torch.ones(1, 2, requires_grad=True))
        hooks.tensor(out, lambda g: seen.append("grad"))
        hooks.param(layer.weight, lambda p: seen.append("param"))
        assert len(hooks) == 4
        out.sum().backward()
    assert seen == ["pre", "fwd", "grad", "param"]
    assert len(hooks) == 0 and _count(layer) == 0
    assert not out._backward_hooks
    assert not layer.weight._post_accumulate_grad_hooks


def test_removal_on_exception_and_idempotent():
    layer = nn.Linear(2, 2)
    hooks = HookSet()
    with pytest.raises(RuntimeError), hooks:
        hooks.forward(layer, lambda m, args, out: None)
        raise RuntimeError("boom")
    assert _count(layer) == 0
    hooks.remove()
    assert len(hooks) == 0


def test_len_counts_only_live_handles():
    layer = nn.Linear(2, 2)
    hooks = HookSet()
    handle = hooks.forward(layer, lambda m, args, out: None)
    hooks.forward_pre(layer, lambda m, args: None)
    handle.remove()
    assert len(hooks) == 1
    hooks.remove()


def test_forward_hook_with_always_call_sees_a_failing_forward():
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("bad input")

    module, seen = Fails(), []
    with HookSet() as hooks:
        hooks.forward(module, lambda m, args, out: seen.append(out), always_call=True)
        with pytest.raises(ValueError):
            module(torch.ones(1))
    assert seen == [None]


def test_add_takes_ownership_of_foreign_handles():
    layer = nn.Linear(2, 2)
    with HookSet() as hooks:
        hooks.add(layer.register_forward_hook(lambda m, args, out: None))
        assert len(hooks) == 1
    assert _count(layer) == 0


def test_handles_of_dead_tensors_are_forgotten():
    layer = nn.Linear(2, 2)
    with HookSet() as hooks:
        hooks.forward(layer, lambda m, args, out: None)
        for _ in range(300):
            out = layer(torch.ones(1, 2))
            hooks.tensor(out, lambda g: None)
            out.sum().backward()
        del out
        assert len(hooks) == 1
        assert len(hooks._handles) < 100
    assert _count(layer) == 0


class GradHook:
    """The articles' OutputHook, for gradients: keeps what every call of the hooked module received."""

    def __init__(self, replace_with_zeros: bool = False):
        self.grad_inputs, self.grad_outputs = [], []
        self.replace_with_zeros = replace_with_zeros

    def __call__(self, module, grad_input, grad_output):
        self.grad_inputs.append(grad_input)
        self.grad_outputs.append(grad_output)
        if self.replace_with_zeros:
            return (torch.zeros_like(grad_input[0]),)
        return None


def _resnet18_train() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).train()


def _no_hooks_left(model: nn.Module) -> bool:
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return all(not getattr(m, kind) for m in model.modules() for kind in kinds)


def test_backward_hook_next_to_inplace_relu_matches_torch_and_autograd():
    model, x = _resnet18_train(), torch.randn(2, 3, 64, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified inplace"), HookSet() as hooks:
        hooks.add(model.bn1.register_full_backward_hook(lambda m, gi, go: None))
        model(x).sum().backward()  # torch's own hook fails here: the reason for HookSet.backward
    # The reference: the same weights with an out-of-place ReLU, where torch's own hook works.
    reference = copy.deepcopy(model)
    reference.relu.inplace = False
    expected = GradHook()
    kept = {}
    handles = [
        reference.bn1.register_full_backward_hook(expected),
        reference.bn1.register_forward_hook(lambda m, args, out: kept.update(input=args[0], output=out)),
    ]
    loss = reference(x).square().mean()
    grad_in, grad_out = torch.autograd.grad(loss, [kept["input"], kept["output"]], retain_graph=True)
    loss.backward()
    for h in handles:
        h.remove()

    hook = GradHook()
    with HookSet() as hooks:
        hooks.backward(model.bn1, hook)
        model(x).square().mean().backward()
    assert _no_hooks_left(model)
    assert len(hook.grad_outputs) == 1 and len(hook.grad_outputs[0]) == 1 and len(hook.grad_inputs[0]) == 1
    torch.testing.assert_close(hook.grad_outputs[0][0], grad_out)
    torch.testing.assert_close(hook.grad_inputs[0][0], grad_in)
    torch.testing.assert_close(hook.grad_outputs[0][0], expected.grad_outputs[0][0])
    torch.testing.assert_close(hook.grad_inputs[0][0], expected.grad_inputs[0][0])


def test_backward_hook_without_input_grad_sees_none_like_torch():
    model, x = _resnet18_train(), torch.randn(2, 3, 64, 64)  # the image needs no grad
    hook = GradHook()
    with HookSet() as hooks:
        hooks.backward(model.conv1, hook)
        model(x).sum().backward()
    assert hook.grad_inputs == [(None,)]
    assert hook.grad_outputs[0][0].shape == (2, 64, 32, 32)


def test_backward_hook_can_replace_the_input_gradient():
    model, x = _resnet18_train(), torch.randn(2, 3, 64, 64)
    with HookSet() as hooks:
        hooks.backward(model.bn1, GradHook(replace_with_zeros=True))
        model(x).sum().backward()
    assert model.conv1.weight.grad is not None
    assert not model.conv1.weight.grad.any()  # conv1 only gets bn1's (replaced) input gradient
    assert model.bn1.weight.grad.any()


def test_backward_hook_refuses_a_replacement_for_several_inputs():
    class Add(nn.Module):
        def forward(self, a, b):
            return a * b

    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    module = Add()
    with HookSet() as hooks, pytest.raises(TypeError, match="exactly one input tensor"):
        hooks.backward(module, lambda m, gi, go: gi)
        module(a, b).sum().backward()
    assert _no_hooks_left(module)


def test_no_hook_is_left_when_the_backward_raises():
    model, x = _resnet18_train(), torch.randn(2, 3, 64, 64)

    def fails(module, grad_input, grad_output):
        raise ValueError("hook failed")

    hooks = HookSet()
    with pytest.raises(ValueError, match="hook failed"), hooks:
        hooks.backward(model.bn1, fails)
        model(x).sum().backward()
    assert len(hooks) == 0
    assert _no_hooks_left(model)


def test_switched_hooks_are_registered_only_while_on_and_never_after_clear():
    first, second, seen = nn.Linear(2, 2), nn.Linear(2, 2), []
    hooks = SwitchedHooks()
    hooks.targets([(first, lambda m, args, out: seen.append("first"))])
    first(torch.ones(1, 2))
    assert seen == [] and _count(first) == 0
    hooks.switch(True)
    hooks.switch(True)  # already on: nothing registered twice
    first(torch.ones(1, 2))
    assert seen == ["first"] and _count(first) == 1
    hooks.targets([(second, lambda m, args, out: seen.append("second"))])  # stays on, moves over
    first(torch.ones(1, 2))
    second(torch.ones(1, 2))
    assert seen == ["first", "second"] and (_count(first), _count(second)) == (0, 1)
    hooks.switch(False)
    assert _count(second) == 0
    hooks.clear()
    hooks.switch(True)
    assert _count(first) + _count(second) == 0
