"""Each wrapper in hookscope.compat does what the torch call it wraps does (run on every torch upgrade)."""

import sys

import torch
from torch import nn

from hookscope import compat


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
