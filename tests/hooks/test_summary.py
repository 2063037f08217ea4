import json
from collections import UserDict

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import hookscope as hs


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _explanation(exc: BaseException) -> str:
    """The message plus hookscope's note (a PEP 678 note; on Python 3.10 it is part of the message)."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def _lenet(fc_in: int = 400) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 6, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(fc_in, 10),
    )


class Twice(nn.Module):
    """One block applied twice, plus a parameter held by the model itself (not by a child)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(x)) * self.scale)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.decode = nn.Linear(16, 50, bias=False)
        self.decode.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decode(self.embed(tokens))


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(12, 4)
        self.meta = nn.Linear(3, 4)

    def forward(self, batch: dict[str, torch.Tensor], scale: float = 1.0) -> torch.Tensor:
        return (self.image(batch["image"]) + self.meta(batch["meta"])) * scale


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.proj(x)
        return y if mask is None else y * mask


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(10, 20, batch_first=True)
        self.fc = nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Flattening(nn.Module):
    """A custom forward whose reshape hands the classifier the wrong width."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(4 * 28 * 28, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return self.classifier(h.flatten(1))


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(y)], dim=0)


def test_resnet34_params_macs_and_rows(resnet34_eval):
    s = hs.summary(resnet34_eval, input_size=(1, 3, 224, 224))
    assert s.total_params == 21_797_672
    assert s.trainable_params == 21_797_672
    assert abs(s.total_macs - 3.664e9) / 3.664e9 < 0.01
    assert sum(row.params for row in s.rows) == s.total_params
    assert sum(row.macs for row in s.rows) == s.total_macs
    assert (s.rows[0].name, s.rows[0].type, s.rows[0].depth) == ("", "ResNet", 0)
    conv1 = next(row for row in s.rows if row.name == "conv1")
    assert conv1.input_shapes == [(1, 3, 224, 224)]
    assert conv1.output_shapes == [(1, 64, 112, 112)]
    assert conv1.params == 64 * 3 * 7 * 7
    assert conv1.macs == 64 * 3 * 7 * 7 * 112 * 112
    assert sum(1 for row in s.rows if row.type == "Conv2d") == 36
    assert s.param_bytes == 4 * 21_797_672
    assert s.buffer_elements == sum(b.numel() for b in resnet34_eval.buffers())
    assert s.input_bytes == 4 * 3 * 224 * 224
    assert s.activation_bytes > 4 * 64 * 112 * 112
    assert s.failed_module is None


def test_printed_table_has_rows_and_totals(resnet34_eval):
    text = str(hs.summary(resnet34_eval, input_size=(1, 3, 224, 224), device="meta"))
    assert "layer4.2.conv2 (Conv2d)" in text
    assert "[1, 64, 112, 112]" in text
    assert "Total params: 21,797,672" in text
    assert "Total MACs: 3.66 G" in text
    assert "(reused)" in text  # every BasicBlock calls its ReLU twice


def test_depth_folds_deeper_calls_into_their_ancestor(resnet34_eval):
    full = hs.summary(resnet34_eval, input_size=(1, 3, 224, 224), device="meta")
    shallow = hs.summary(resnet34_eval, input_size=(1, 3, 224, 224), depth=1, device="meta")
    assert {row.depth for row in shallow.rows} == {0, 1}
    assert [row.name for row in shallow.rows][:3] == ["", "conv1", "bn1"]
    layer1 = next(row for row in shallow.rows if row.name == "layer1")
    assert layer1.params == sum(p.numel() for p in resnet34_eval.layer1.parameters())
    assert layer1.macs == sum(row.macs for row in full.rows if row.name.startswith("layer1."))
    assert shallow.total_macs == full.total_macs
    assert sum(row.params for row in shallow.rows) == full.total_params


def test_module_reused_twice_is_listed_twice_and_counted_once():
    model = Twice()
    s = hs.summary(model, torch.randn(4, 8))
    block_rows = [row for row in s.rows if row.name == "block"]
    assert [row.call for row in block_rows] == [0, 1]
    assert [row.params for row in block_rows] == [8 * 8 + 8, 0]
    assert [row.macs for row in block_rows] == [4 * 8 * 8, 4 * 8 * 8]
    assert s.rows[0].params == 8  # `scale` is held by the model itself
    assert s.total_params == sum(p.numel() for p in model.parameters()) == 8 * 8 + 8 + 8 + 8 * 2 + 2
    assert sum(row.params for row in s.rows) == s.total_params


def test_tied_weights_are_counted_once():
    s = hs.summary(Tied(), torch.zeros(2, 7, dtype=torch.long))
    assert s.total_params == 50 * 16
    assert {row.name: row.params for row in s.rows} == {"": 0, "embed": 800, "decode": 0}
    assert next(row for row in s.rows if row.name == "decode").macs == 2 * 7 * 16 * 50


def test_linear_macs_include_every_leading_dimension():
    s = hs.summary(nn.Linear(32, 64), input_size=(2, 5, 7, 32))
    assert s.total_macs == 2 * 5 * 7 * 32 * 64


def test_dict_input_is_passed_as_one_argument_and_kwargs_as_keywords():
    batch = {"image": torch.randn(2, 12), "meta": torch.randn(2, 3)}
    s = hs.summary(DictModel(), batch, scale=2.0)
    assert s.rows[0].input_shapes == [(2, 12), (2, 3)]
    shapes = {row.name: row.output_shapes for row in s.rows}
    assert shapes == {"": [(2, 4)], "image": [(2, 4)], "meta": [(2, 4)]}
    assert s.total_macs == 2 * 12 * 4 + 2 * 3 * 4


def test_keyword_tensor_inputs_are_traced():
    s = hs.summary(Masked(), torch.randn(3, 6), mask=torch.ones(3, 1))
    assert s.rows[0].input_shapes == [(3, 6), (3, 1)]


def test_several_input_sizes_with_their_dtypes():
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(100, 8)
            self.fc = nn.Linear(8, 8)

        def forward(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
            return self.embed(tokens).mean(1) + self.fc(features)

    s = hs.summary(TwoInputs(), input_size=[(2, 5), (2, 8)], dtypes=[torch.long, torch.float32])
    assert s.rows[0].input_shapes == [(2, 5), (2, 8)]
    assert s.input_bytes == 2 * 5 * 8 + 2 * 8 * 4


def test_lstm_shapes_params_and_macs_on_cpu_and_meta():
    model = Recurrent()
    s = hs.summary(model, input_size=(3, 5, 10))
    lstm = next(row for row in s.rows if row.name == "lstm")
    assert lstm.output_shapes == [(3, 5, 20), (1, 3, 20), (1, 3, 20)]
    assert lstm.params == 4 * 20 * (10 + 20) + 2 * 4 * 20
    assert lstm.macs == 3 * 5 * 4 * 20 * (10 + 20)  # input and hidden projections, every step
    meta = hs.summary(model, input_size=(3, 5, 10), device="meta")
    assert [row.macs for row in meta.rows] == [row.macs for row in s.rows]


def test_cpu_attention_is_counted_where_flopcountermode_sees_nothing():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    x = torch.randn(2, 10, 32)
    s = hs.summary(layer, x)
    attention = 2 * 2 * 10 * 10 * 32  # q @ k^T and weights @ v over 4 heads of 8
    projections = 2 * 10 * 32 * 32 * 4  # q, k, v and out
    feed_forward = 2 * 10 * 32 * 64 * 2
    assert s.total_macs == attention + projections + feed_forward
    assert next(row for row in s.rows if row.name == "self_attn").macs == attention + projections
    assert hs.summary(layer, x, device="meta").total_macs == s.total_macs
    with torch.no_grad(), FlopCounterMode(display=False) as raw:
        layer(x)  # eval mode: the fused fast path, which FlopCounterMode counts as zero
    assert raw.get_total_flops() // 2 < s.total_macs
    assert torch.backends.mha.get_fastpath_enabled()


def test_vit_b_16_macs():
    with torch.device("meta"):
        model = torchvision.models.vit_b_16(weights=None)
    s = hs.summary(model, input_size=(1, 3, 224, 224))
    assert abs(s.total_macs - 17.56e9) / 17.56e9 < 0.05
    assert s.total_params == 86_567_656
    encoder = next(row for row in s.rows if row.name == "encoder")
    assert encoder.params == 197 * 768  # the position embedding is held by the Encoder itself


def test_state_is_restored_and_no_gradient_is_computed():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    model.train()
    model[2].eval()
    model[3].weight.requires_grad_(False)
    stats_before = model[1].running_mean.clone()
    rng_before = torch.get_rng_state()
    s = hs.summary(model, input_size=(5, 4))
    assert [m.training for m in model.modules()] == [True, True, True, False, True]
    assert [p.requires_grad for p in model.parameters()] == [True, True, True, True, False, True]
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(model[1].running_mean, stats_before)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert _hook_count(model) == 0
    assert s.trainable_params == s.total_params - 8 * 2
    assert s.non_trainable_params == 16


def test_meta_device_summarises_a_real_model_without_touching_it():
    model = _lenet()
    weight = model[0].weight.detach().clone()
    s = hs.summary(model, input_size=(1, 3, 32, 32), device="meta")
    real = hs.summary(model, input_size=(1, 3, 32, 32))
    assert [(r.name, r.output_shapes, r.params, r.macs) for r in s.rows] == [
        (r.name, r.output_shapes, r.params, r.macs) for r in real.rows
    ]
    assert model[0].weight.device.type == "cpu"
    assert torch.equal(model[0].weight, weight)


def test_to_dict_is_json_ready():
    data = hs.summary(Twice(), torch.randn(4, 8)).to_dict()
    decoded = json.loads(json.dumps(data))
    assert decoded["total_params"] == 8 * 8 + 8 + 8 + 8 * 2 + 2
    assert decoded["rows"][1]["name"] == "block"
    assert decoded["rows"][1]["input_shapes"] == [[4, 8]]
    assert decoded["failed_module"] is None


def test_shape_mismatch_in_sequential_names_module_shapes_and_expectation():
    model = _lenet(fc_in=400)
    with pytest.raises(RuntimeError, match="mat1 and mat2") as info:
        hs.summary(model, input_size=(1, 3, 28, 28))
    note = _explanation(info.value)
    assert "module '7' (Linear)" in note
    assert "received [1, 256]" in note
    assert "Linear(in_features=400) got last dimension 256" in note
    assert "6 [1, 256] -> 7 ✗" in note
    partial = info.value.summary
    assert [row.name for row in partial.rows] == ["", "0", "1", "2", "3", "4", "5", "6", "7"]
    assert [row.name for row in partial.rows if row.failed] == ["", "7"]
    assert partial.rows[7].output_shapes == [(1, 256)]
    assert partial.failed_module == "7"
    assert "partial: the forward failed" in str(partial)
    assert _hook_count(model) == 0


def test_shape_mismatch_in_a_custom_forward_names_the_nested_module():
    model = Flattening()
    with pytest.raises(RuntimeError) as info:
        hs.summary(model, input_size=(2, 1, 28, 28))
    note = _explanation(info.value)
    assert "module 'classifier.0' (Linear)" in note
    assert "received [2, 2704]" in note
    assert "Linear(in_features=3136) got last dimension 2704" in note
    assert "features.1 [2, 4, 26, 26]" in note
    names = [row.name for row in info.value.summary.rows]
    assert names == ["", "features", "features.0", "features.1", "classifier", "classifier.0"]
    assert [row.name for row in info.value.summary.rows if row.failed] == ["", "classifier", "classifier.0"]
    assert _hook_count(model) == 0


def test_error_raised_by_the_models_own_code_keeps_its_type():
    with pytest.raises(RuntimeError, match="Sizes of tensors must match") as info:
        hs.summary(Concat(), (torch.randn(2, 8), torch.randn(3, 8)))
    note = _explanation(info.value)
    assert "forward of Concat, which received [2, 8], [3, 8]" in note
    assert "Concat.forward itself" in note
    assert "a [2, 16] -> b [3, 4] -> (model) ✗" in note
    assert info.value.summary.failed_module == ""

    class Checked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert x.shape[-1] == 3, "expected RGB"
            return x

    with pytest.raises(AssertionError, match="expected RGB") as assertion:
        hs.summary(Checked(), input_size=(1, 1))
    assert assertion.value.summary.rows[0].failed


def test_conv_channel_mismatch_says_what_the_conv_expects():
    with pytest.raises(RuntimeError) as info:
        hs.summary(_lenet(), input_size=(1, 1, 32, 32))
    assert "Conv2d(in_channels=3) got 1 channels" in _explanation(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs an input"),
        ({"example_input": torch.randn(1, 4), "input_size": (1, 4)}, "not both"),
        ({"input_size": [(1, 4), (1, 4)], "dtypes": [torch.float32]}, "2 input shapes but 1 dtypes"),
        ({"example_input": torch.randn(1, 4), "dtypes": [torch.float32]}, "dtypes go with input_size"),
        ({"input_size": (1, 4), "depth": -1}, "depth=-1 must be >= 0"),
    ],
)
def test_bad_arguments_get_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        hs.summary(nn.Linear(4, 2), **kwargs)
    assert "\n" not in str(info.value)


def test_not_a_module_and_wrong_device_are_explained():
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        hs.summary(lambda x: x, input_size=(1, 4))
    with pytest.raises(ValueError, match=r"model is on cpu but device=cuda.*model.to\('cuda'\)"):
        hs.summary(nn.Linear(4, 2), input_size=(1, 4), device="cuda")


class EventLog(hs.Callback):
    """Records every event that reaches it (Learner.summary must fire none)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def before_fit(self) -> None:
        self.events.append("before_fit")

    def before_batch(self) -> None:
        self.events.append("before_batch")

    def after_pred(self) -> None:
        self.events.append("after_pred")


def test_learner_summary_uses_one_training_batch_and_fires_no_callback():
    from hookscope.data.digits import digits_loaders
    from hookscope.models import digits_cnn

    torch.manual_seed(0)
    train_dl, valid_dl = digits_loaders(batch_size=32)
    log = EventLog()
    learn = hs.Learner(digits_cnn(), (train_dl, valid_dl), nn.CrossEntropyLoss(), cbs=[log], progress=False)
    loader_state = train_dl.generator.get_state()
    rng_state = torch.get_rng_state()
    s = learn.summary()
    assert s.rows[0].input_shapes == [(32, 1, 8, 8)]
    assert s.rows[0].output_shapes == [(32, 10)]
    assert s.total_params == sum(p.numel() for p in learn.model.parameters())
    assert log.events == []
    assert learn.model.training
    assert torch.equal(train_dl.generator.get_state(), loader_state)
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert [row.depth for row in learn.summary(depth=1).rows] == [0, 1, 1]


class Fallback(nn.Module):
    """Recovers from a failing branch, then (optionally) fails later in another module."""

    def __init__(self, fail_later: bool) -> None:
        super().__init__()
        self.wide = nn.Linear(16, 4)
        self.narrow = nn.Linear(8, 4)
        self.head = nn.Linear(5 if fail_later else 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            h = self.wide(x)
        except RuntimeError:
            h = self.narrow(x)
        return self.head(h)


def test_a_failure_recovered_inside_the_forward_is_not_blamed():
    s = hs.summary(Fallback(fail_later=False), input_size=(3, 8))
    assert s.failed_module is None
    assert [row.name for row in s.rows if row.failed] == ["wide"]
    with pytest.raises(RuntimeError) as info:
        hs.summary(Fallback(fail_later=True), input_size=(3, 8))
    assert info.value.summary.failed_module == "head"
    assert "module 'head' (Linear)" in _explanation(info.value)


def test_a_module_returning_none_is_not_a_failure():
    class Logger(nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            return None

    class WithLogger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.log = Logger()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.log(x)
            return self.fc(x)

    s = hs.summary(WithLogger(), input_size=(1, 4))
    log_row = next(row for row in s.rows if row.name == "log")
    assert (log_row.failed, log_row.output_shapes) == (False, [])
    assert "--" in str(s)


def test_embedding_index_error_says_the_valid_range():
    with pytest.raises(IndexError) as info:
        hs.summary(Tied(), torch.full((1, 3), 50))
    assert "module 'embed' (Embedding)" in _explanation(info.value)
    assert "indices in [0, 50)" in _explanation(info.value)


def test_a_custom_mapping_input_keeps_its_type_and_the_callers_copy_stays_put():
    class Batch(UserDict):
        """A tokenizer-style batch: a mapping whose items are also attributes."""

        def __getattr__(self, key: str) -> torch.Tensor:
            if key == "data":
                raise AttributeError(key)
            return self.data[key]

    class ReadsAttributes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, batch: Batch) -> torch.Tensor:
            return self.fc(batch.features)

    batch = Batch(features=torch.randn(4, 3))
    for device in ("cpu", "meta"):
        s = hs.summary(ReadsAttributes(), batch, device=device)
        assert s.rows[0].input_shapes == [(4, 3)]
        assert s.total_macs == 4 * 3 * 2
    assert batch.features.device.type == "cpu"


@pytest.mark.parametrize(
    ("model", "size", "expected"),
    [
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(4)), (1, 3, 8, 8), "BatchNorm2d(num_features=4)"),
        (nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(6)), (2, 3), "trailing dimensions [8]"),
        (nn.Conv2d(3, 4, 3), (3, 3), "Conv2d expects a 4-d (N, C, H, W) or 3-d input, got 2-d [3, 3]"),
        (nn.LSTM(10, 20), (5, 1, 12), "LSTM(input_size=10) got last dimension 12"),
    ],
)
def test_common_layers_say_what_they_expect(model, size, expected):
    with pytest.raises((RuntimeError, ValueError)) as info:
        hs.summary(model, input_size=size)
    assert expected in _explanation(info.value)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_scripted_submodule_counts_in_its_parent():
    model = nn.Sequential(torch.jit.script(nn.Linear(4, 6)), nn.ReLU())
    s = hs.summary(model, input_size=(2, 4))
    assert [row.name for row in s.rows] == ["", "1"]
    assert (s.rows[0].params, s.rows[0].macs) == (4 * 6 + 6, 2 * 4 * 6)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_scripted_model_is_one_row_with_its_params_and_macs():
    model = _mlp()
    eager = hs.summary(model, input_size=(100, 128))
    s = hs.summary(torch.jit.script(model), input_size=(100, 128))
    assert len(s.rows) == 1
    assert (s.rows[0].input_shapes, s.rows[0].output_shapes) == ([(100, 128)], [(100, 1)])
    assert s.total_params == s.rows[0].params == eager.total_params == 16_705
    assert s.total_macs == s.rows[0].macs == eager.total_macs == 100 * (128 * 64 + 64 * 128 + 128)
    assert "TorchScript" in s.notes[0] and f"Note: {s.notes[0]}" in str(s)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_scripted_submodule_is_named_in_a_note():
    model = nn.Sequential(nn.ReLU(), torch.jit.script(nn.Sequential(nn.Linear(4, 6))))
    s = hs.summary(model, input_size=(2, 4))
    assert len(s.notes) == 1 and "'1' is TorchScript" in s.notes[0]


def test_lazy_parameters_that_stay_uninitialised_are_skipped_with_a_note():
    class HalfUsed(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.LazyLinear(3), nn.LazyLinear(5)

        def forward(self, x):
            return self.used(x)

    s = hs.summary(HalfUsed(), input_size=(2, 4))
    assert s.total_params == 4 * 3 + 3
    assert s.total_macs == 2 * 4 * 3
    assert s.notes == [
        "2 lazy parameters/buffers are still uninitialised after the forward (their module did not run) "
        "and are not counted: unused.weight, unused.bias"
    ]
    assert "Note: 2 lazy parameters" in str(s)


@pytest.mark.parametrize("input_size", [{0: 1}, 4, (1.5, 4), [(2, 4), {0: 1}], (True, 4)])
def test_a_malformed_input_size_is_refused_in_one_line(input_size):
    with pytest.raises(TypeError, match=r"is not a shape; pass a tuple/list of ints") as info:
        hs.summary(nn.Linear(4, 2), input_size=input_size)
    assert "\n" not in str(info.value)
