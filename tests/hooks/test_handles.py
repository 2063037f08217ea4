import pytest
import torch
from torch import nn

import hookscope as hs


def _count(module: nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


def test_registers_and_removes_every_kind_of_hook():
    layer = nn.Linear(2, 2)
    seen = []
    with hs.HookSet() as hooks:
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
    hooks = hs.HookSet()
    with pytest.raises(RuntimeError), hooks:
        hooks.forward(layer, lambda m, args, out: None)
        raise RuntimeError("boom")
    assert _count(layer) == 0
    hooks.remove()
    assert len(hooks) == 0


def test_len_counts_only_live_handles():
    layer = nn.Linear(2, 2)
    hooks = hs.HookSet()
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
    with hs.HookSet() as hooks:
        hooks.forward(module, lambda m, args, out: seen.append(out), always_call=True)
        with pytest.raises(ValueError):
            module(torch.ones(1))
    assert seen == [None]


def test_add_takes_ownership_of_foreign_handles():
    layer = nn.Linear(2, 2)
    with hs.HookSet() as hooks:
        hooks.add(layer.register_forward_hook(lambda m, args, out: None))
        assert len(hooks) == 1
    assert _count(layer) == 0


def test_handles_of_dead_tensors_are_forgotten():
    layer = nn.Linear(2, 2)
    with hs.HookSet() as hooks:
        hooks.forward(layer, lambda m, args, out: None)
        for _ in range(300):
            out = layer(torch.ones(1, 2))
            hooks.tensor(out, lambda g: None)
            out.sum().backward()
        del out
        assert len(hooks) == 1
        assert len(hooks._handles) < 100
    assert _count(layer) == 0
