from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from types import MappingProxyType

import pytest
import torch
from torch import nn

from hookscope.hooks.tensors import first_tensor, grad_norms, map_tensors, model_device, tensors_in

Pair = namedtuple("Pair", ["left", "right"])


@dataclass
class Output:
    logits: torch.Tensor
    hidden: tuple
    note: str = "x"


@dataclass(frozen=True)
class Frozen:
    value: torch.Tensor
    count: int = field(default=0, init=False)


class OutputDict(OrderedDict):
    """Stands in for Hugging Face's ModelOutput: an OrderedDict subclass carrying extra state."""

    extra = "kept"


def _ts(n):
    return [torch.full((1,), float(i)) for i in range(n)]


def test_tensors_in_walks_every_container_in_written_order():
    a, b, c, d, e, f, g = _ts(7)
    value = (a, [Pair(b, {"x": c, "skip": "text"}), 3, None], {"y": Output(d, (e, "no"))}, Frozen(f), g)
    assert [t.item() for t in tensors_in(value)] == [0, 1, 2, 3, 4, 5, 6]


def test_tensors_in_of_a_tensor_and_of_values_without_tensors():
    t = torch.ones(2)
    assert tensors_in(t)[0] is t
    assert tensors_in(nn.Parameter(t)) and len(tensors_in(nn.Parameter(t))) == 1
    assert tensors_in("text") == [] and tensors_in(None) == [] and tensors_in((1, [2.0], {"a": "b"})) == []
    assert tensors_in(Output) == []  # a dataclass type is not an instance


def test_mappings_of_every_kind_are_walked_in_their_order():
    a, b, c = _ts(3)
    assert tensors_in(OutputDict(z=a, y=b)) == [a, b]
    assert tensors_in(MappingProxyType({"k": c})) == [c]
    assert tensors_in(defaultdict(list, {"k": [a, b]})) == [a, b]


def test_first_tensor_is_depth_first_and_none_without_tensors():
    a, b, c = _ts(3)
    assert first_tensor(a) is a
    assert first_tensor(((a, b), c)) is a  # an LSTM's (out, (h, c)) -> out; a nested first item counts
    assert first_tensor((None, "s", {"k": b})) is b
    assert first_tensor(Output(c, ())) is c
    assert first_tensor((1, "x", None)) is None


def test_map_tensors_keeps_structure_types_and_non_tensors():
    a, b, c, d, e = _ts(5)
    value = [Pair(a, {"x": b, "n": 1}), (c, "s"), OutputDict(p=d), Output(e, (None,), note="kept")]
    mapped = map_tensors(lambda t: t + 10, value)
    assert type(mapped) is list and type(mapped[0]) is Pair and type(mapped[1]) is tuple
    assert type(mapped[2]) is OutputDict and mapped[2].extra == "kept" and list(mapped[2]) == ["p"]
    assert type(mapped[3]) is Output and mapped[3].note == "kept" and mapped[3].hidden == (None,)
    assert [t.item() for t in tensors_in(mapped)] == [10, 11, 12, 13, 14]
    assert mapped[0].right["n"] == 1 and mapped[1][1] == "s"
    assert [t.item() for t in tensors_in(value)] == [0, 1, 2, 3, 4]  # the input is left alone


def test_map_tensors_rebuilds_frozen_dataclasses_without_calling_init_again():
    original = Frozen(torch.zeros(1))
    object.__setattr__(original, "count", 7)  # an init=False field set after construction
    mapped = map_tensors(lambda t: t + 1, original)
    assert type(mapped) is Frozen and mapped is not original
    assert mapped.value.item() == 1 and mapped.count == 7 and original.value.item() == 0


def test_map_tensors_of_immutable_mappings_and_return_types():
    proxy = map_tensors(lambda t: t * 2, MappingProxyType({"k": torch.ones(1)}))
    assert type(proxy) is dict and proxy["k"].item() == 2
    result = torch.max(torch.tensor([[1.0, 3.0]]), dim=1)
    mapped = map_tensors(lambda t: t + 1, result)
    assert type(mapped) is type(result) and mapped.values.item() == 4 and mapped.indices.item() == 2
    defaults = map_tensors(lambda t: t, defaultdict(list, {"k": torch.ones(1)}))
    assert type(defaults) is defaultdict and defaults["missing"] == []


def test_map_tensors_leaves_non_tensor_leaves_as_the_same_objects():
    marker = object()
    assert map_tensors(lambda t: t, marker) is marker
    assert map_tensors(lambda t: t, (marker,))[0] is marker


def test_model_device_prefers_parameters_then_buffers_then_cpu():
    assert model_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(nn.Linear(2, 2, device="meta")) == torch.device("meta")
    buffers_only = nn.Module()
    buffers_only.register_buffer("mean", torch.zeros(3, device="meta"))
    assert model_device(buffers_only) == torch.device("meta")
    assert model_device(nn.ReLU()) == torch.device("cpu")
    both = nn.Sequential(nn.BatchNorm1d(2, device="meta"))
    assert model_device(both) == torch.device("meta")


def test_grad_norms_match_vector_norm_per_tensor():
    torch.manual_seed(0)
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2, dtype=torch.float64), torch.zeros(1)]
    norms = grad_norms(tensors)
    assert norms.dtype == torch.float32 and norms.shape == (4,)
    expected = torch.stack([torch.linalg.vector_norm(t).float() for t in tensors])
    torch.testing.assert_close(norms, expected)


def test_grad_norms_of_mixed_dtypes_of_non_finite_and_of_nothing():
    norms = grad_norms([torch.ones(4, dtype=torch.bfloat16), torch.tensor([float("nan")]), torch.ones(9)])
    assert norms.dtype == torch.float32
    assert norms[0].item() == 2 and norms[1].isnan() and norms[2].item() == 3
    assert grad_norms([torch.tensor([float("inf"), 1.0])])[0].isinf()
    empty = grad_norms([])
    assert empty.shape == (0,) and empty.dtype == torch.float32


@pytest.mark.cuda
def test_grad_norms_and_model_device_on_cuda():
    model = nn.Linear(3, 3).cuda()
    assert model_device(model).type == "cuda"
    grads = [torch.randn(3, 3, device="cuda"), torch.randn(3, device="cuda")]
    norms = grad_norms(grads)
    assert norms.device.type == "cuda"
    torch.testing.assert_close(norms.cpu(), torch.stack([torch.linalg.vector_norm(g.cpu()) for g in grads]))
