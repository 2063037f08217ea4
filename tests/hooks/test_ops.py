"""The op names and tensors that find_nonfinite and compare both report: one rule, so their reports agree."""

from collections import namedtuple

import torch

from hookscope.hooks.ops import float_tensors, op_name


def test_an_op_is_named_without_its_overload():
    assert op_name(torch.ops.aten.log.default) == "aten.log"
    assert op_name(torch.ops.aten.add.Tensor) == "aten.add"
    assert op_name(torch.ops.aten.relu_) == "aten.relu_"  # a packet: already the name


def test_only_floating_and_complex_tensors_are_picked_in_order():
    Out = namedtuple("Out", "logits indices")
    x, c = torch.randn(2), torch.randn(2, dtype=torch.complex64)
    value = {"out": Out(x, torch.tensor([1, 0])), "mask": torch.tensor([True]), "extra": [c, 3.0, "x"]}
    picked = float_tensors(value)
    assert len(picked) == 2 and picked[0] is x and picked[1] is c
    assert float_tensors(torch.tensor([1, 2])) == []
