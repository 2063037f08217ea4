import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope.callbacks.layer_stats import ActivationStats, GradientStats, ParamRecord, StepStats
from hookscope.hooks import stats
from hookscope.hooks.select import leaves
from hookscope.train.events import CancelStepException


def loaders(n: int = 48, batch: int = 8, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 6, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch), DataLoader(
        TensorDataset(x[:16], y[:16]), batch_size=8
    )


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(144, 3),
    )


def learner(model: nn.Module, *cbs: hs.Callback, lr: float = 1e-2) -> hs.Learner:
    return hs.Learner(model, loaders(), nn.CrossEntropyLoss(), lr=lr, cbs=list(cbs), progress=False)


def all_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class Raise(hs.Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def after_pred(self) -> None:
        if self.learn.training and self.learn.training_step == self.at_step:
            raise ValueError("boom")


def test_activation_stats_equal_a_direct_computation_on_captured_outputs():
    model = small_cnn()
    acts = ActivationStats(select=["1", "2"], bins=20, range=(-4.0, 4.0), sample=None)  # all exact
    learn = learner(model, acts)
    with hs.capture(model, ["1", "2"]) as cap:
        learn.fit(1)
    n_train = len(learn.dls.train)
    history = acts.history
    assert list(history) == ["1", "2"]
    assert [r.step for r in history["2"]] == list(range(n_train))
    for name in ("1", "2"):
        for record, captured in zip(history[name], cap.calls(name)[:n_train], strict=True):
            values = captured.double()
            got = record.stats
            assert isinstance(record, StepStats)
            assert got.count == values.numel()
            # float32 sums: the mean is exact to ~1e-7 of the spread (BatchNorm outputs have mean ~0)
            assert got.mean == pytest.approx(values.mean().item(), abs=1e-6 * got.std)
            assert got.std == pytest.approx(values.std(unbiased=False).item(), rel=1e-6)
            assert got.zero_fraction == pytest.approx((values == 0).double().mean().item())
            want_hist = torch.histc(values.clamp(-4.0, 4.0), bins=20, min=-4.0, max=4.0)
            np.testing.assert_array_equal(got.histogram, want_hist.long().numpy())
            assert got.abs_max == pytest.approx(values.abs().max().item(), rel=1e-6)
            rms = values.pow(2).mean(dim=(0, 2, 3)).sqrt().numpy()
            np.testing.assert_allclose(got.channel_rms, rms, rtol=1e-6)


def test_batchnorm_stats_keep_negatives_although_an_inplace_relu_follows():
    acts = ActivationStats(select=["1", "2"])
    learner(small_cnn(), acts).fit(1)
    bn, relu = acts.latest()["1"].stats, acts.latest()["2"].stats
    assert bn.histogram[: len(bn.histogram) // 2].sum() > 0
    assert bn.zero_fraction == 0.0
    assert relu.histogram[: len(relu.histogram) // 2].sum() == 0
    assert relu.zero_fraction > 0.2


def test_every_records_only_multiples_of_the_interval_and_validation_only_when_asked():
    acts, with_valid = ActivationStats(every=2), ActivationStats(select=nn.ReLU, include_valid=True)
    learn = learner(small_cnn(), acts)
    learn.fit(2)
    assert [r.step for r in acts.history["0"]] == [0, 2, 4, 6, 8, 10]
    assert acts.valid_history == {"0": [], "1": [], "4": []}
    learner(small_cnn(), with_valid).fit(2)
    valid = with_valid.valid_history["2"]
    assert [r.step for r in valid] == [6, 12]
    assert valid[0].stats.count == 16 * 4 * 6 * 6


def test_history_is_bounded_and_still_spans_the_whole_run():
    acts = ActivationStats(select=nn.ReLU, history=4, read_every=1)
    learner(small_cnn(), acts).fit(3)
    steps = [r.step for r in acts.history["2"]]
    assert len(steps) <= 4
    assert steps[0] == 0 and steps[-1] >= 12
    assert acts.every > 1


def test_pending_records_of_all_layers_and_steps_are_read_in_one_transfer(monkeypatch):
    acts = ActivationStats(read_every=10_000)
    learn = learner(small_cnn(), acts, Raise(at_step=5))
    with pytest.raises(ValueError, match="boom"):
        learn.fit(1)
    transfers = []  # to_host: one copy to the host per device (on the CPU, numpy's copy of each tensor)
    original = stats.to_host

    def counting(tensors: list[torch.Tensor]) -> list[np.ndarray]:
        transfers.append(len(tensors))
        return original(tensors)

    monkeypatch.setattr(stats, "to_host", counting)
    history = acts.history
    assert len(transfers) == 1  # every layer's rows of every step, at once
    assert {name: [r.step for r in records] for name, records in history.items()} == {
        name: [0, 1, 2, 3, 4] for name in ("0", "1", "4")
    }
    assert acts.history == history
    assert len(transfers) == 1


def test_hooks_are_removed_after_fit_and_after_a_failure():
    model = small_cnn()
    acts, grads = ActivationStats(), GradientStats(output_grads=True)
    learn = learner(model, acts, grads)
    learn.fit(1)
    assert all_hooks(model) == 0
    learn.add_cb(Raise(at_step=8))
    with pytest.raises(ValueError, match="boom"):
        learn.fit(1)
    assert all_hooks(model) == 0
    assert [r.step for r in acts.history["0"]][-1] == 7


def test_gradient_stats_equal_direct_norms_and_update_ratios():
    class Probe(hs.Callback):
        order = 16

        def __init__(self) -> None:
            self.norms, self.ratios, self.before = [], [], []

        def before_step(self) -> None:
            params = list(self.learn.model.named_parameters())
            self.norms.append({n: p.grad.norm().item() for n, p in params})
            self.before = [p.detach().clone() for _, p in params]

        def after_step(self) -> None:
            params = list(self.learn.model.named_parameters())
            self.ratios.append(
                {n: ((p - b).norm() / p.norm()).item() for (n, p), b in zip(params, self.before, strict=True)}
            )

    grads, probe = GradientStats(output_grads=False), Probe()
    learner(small_cnn(), grads, probe).fit(1)
    history = grads.param_history
    assert list(history) == ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"]
    for name, records in history.items():
        assert [r.step for r in records] == list(range(6))
        assert [r.grad_norm for r in records] == pytest.approx([n[name] for n in probe.norms], rel=1e-5)
        assert [r.update_ratio for r in records] == pytest.approx([r[name] for r in probe.ratios], rel=1e-4)


def test_output_gradient_stats_equal_captured_gradients():
    model = small_cnn()
    grads = GradientStats(
        select=["1", "4"], output_grads=True, update_ratio=False, bins=10, range=(-0.05, 0.05)
    )
    learn = learner(model, grads)
    with hs.capture(model, ["1", "4"], what="grad_output") as cap:
        learn.fit(1)
    for name in ("1", "4"):
        records, captured = grads.history[name], cap.calls(name)
        assert len(records) == len(captured) == 6
        for record, grad in zip(records, captured, strict=True):
            want_mean = grad.double().mean().item()
            assert record.stats.mean == pytest.approx(want_mean, abs=1e-6 * record.stats.std)
            assert record.stats.abs_max == pytest.approx(grad.abs().max().item(), rel=1e-6)


def test_a_parameter_without_gradient_is_recorded_as_none():
    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(36, 3), nn.Linear(36, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x.flatten(1))

    grads = GradientStats(every=3, output_grads=False)
    learner(TwoBranches(), grads).fit(1)
    history = grads.param_history
    assert [r.step for r in history["unused.weight"]] == [0, 3]
    assert all(r.grad_norm is None for r in history["unused.weight"])
    assert all(r.grad_norm is not None and r.grad_norm > 0 for r in history["used.weight"])
    assert isinstance(history["used.bias"][0], ParamRecord)


def test_a_cancelled_step_has_no_update_ratio():
    class SkipStep(hs.Callback):
        order = 20
        skipped = False

        def before_step(self) -> None:
            if not self.skipped:
                self.skipped = True
                raise CancelStepException()

    grads = GradientStats(output_grads=False)
    learn = learner(small_cnn(), grads, SkipStep())
    learn.fit(1)
    records = grads.param_history["0.weight"]
    assert [r.step for r in records] == [0, 0, 1, 2, 3, 4]
    assert records[0].update_ratio is None and records[0].grad_norm is not None
    assert all(r.update_ratio is not None for r in records[1:])


def test_gradient_stats_record_parameters_only_unless_output_grads_are_asked_for():
    model = small_cnn()
    grads = GradientStats()
    learner(model, grads).fit(1)
    assert grads.history == {}
    assert len(grads.param_history["0.weight"]) == len(grads.param_history["4.bias"]) > 0


def test_select_none_is_the_default_set_and_leaves_watches_every_leaf():
    default, explicit, every_leaf = (
        ActivationStats(),
        ActivationStats(select=None),
        ActivationStats(select=leaves),
    )
    for acts in (default, explicit, every_leaf):
        learner(small_cnn(), acts).fit(1)
    assert list(default.history) == list(explicit.history) == ["0", "1", "4"]  # the layers with parameters
    assert list(every_leaf.history) == ["0", "1", "2", "3", "4"]  # ReLU and Flatten too
    grads = GradientStats(select=None, output_grads=True)
    learner(small_cnn(), grads).fit(1)
    assert list(grads.history) == ["0", "1", "4"]


def test_callbacks_are_reachable_by_name_and_exported():
    acts, grads = hs.callbacks.ActivationStats(), hs.callbacks.GradientStats()
    learn = learner(small_cnn(), acts, grads)
    assert learn.activation_stats is acts and learn.gradient_stats is grads


def test_bad_settings_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="every >= 1"):
        ActivationStats(every=0)
    with pytest.raises(ValueError, match="history >= 2"):
        GradientStats(history=1)


def test_a_module_called_twice_per_step_and_a_tuple_output_are_both_recorded():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(36, 36)
            self.rnn = nn.GRU(36, 3, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.shared(self.shared(x.flatten(1)))
            out, _ = self.rnn(h.unsqueeze(1))  # the GRU returns (output, hidden)
            return out[:, 0]

    acts = ActivationStats(select=["shared", "rnn"])
    learner(Twice(), acts).fit(1)
    first = acts.history["shared"][0].stats
    assert first.count == 2 * 8 * 36  # both calls of the batch of 8
    assert acts.history["rnn"][0].stats.count == 8 * 1 * 3


def test_a_dict_output_is_recorded_through_its_first_tensor():
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(36, 3)

        def forward(self, x: torch.Tensor) -> dict:
            logits = self.lin(x.flatten(1))
            return {"logits": logits, "aux": (logits.detach() * 0, "note")}

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = Heads()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.heads(x)["logits"]

    acts = ActivationStats(select=["heads"])
    learner(Model(), acts).fit(1)
    stats = acts.history["heads"][0].stats
    assert stats.count == 8 * 3 and stats.zero_fraction < 1  # the logits, not the zeroed aux tensor


def test_a_second_fit_continues_the_history_and_an_interrupt_removes_the_hooks():
    class Interrupt(hs.Callback):
        def after_pred(self) -> None:
            if self.learn.training_step == 9:
                raise KeyboardInterrupt

    model = small_cnn()
    acts = ActivationStats()
    learn = learner(model, acts)
    learn.fit(1)
    with pytest.raises(KeyboardInterrupt):
        learn.fit(1, cbs=[Interrupt()])
    assert all_hooks(model) == 0
    assert [r.step for r in acts.history["0"]] == list(range(9))


def test_gradient_stats_see_unscaled_gradients_under_float16_loss_scaling():
    grads = GradientStats(output_grads=False, update_ratio=False)
    reference = GradientStats(output_grads=False, update_ratio=False)
    learner(small_cnn(), reference).fit(1)
    learner(small_cnn(), grads, hs.callbacks.MixedPrecision(torch.float16, init_scale=2.0**10)).fit(1)
    got = [r.grad_norm for r in grads.param_history["0.weight"]]
    want = [r.grad_norm for r in reference.param_history["0.weight"]]
    assert got[0] == pytest.approx(want[0], rel=0.05)


def test_standalone_stats_record_on_their_own_cadence_and_are_the_fits_layer_statistics():
    from hookscope.callbacks.layer_stats import layer_statistics

    acts, grads = ActivationStats(every=2), GradientStats(every=3)
    learn = learner(small_cnn(), acts, grads)
    learn.fit(1)  # 6 steps
    assert [r.step for r in acts.history["0"]] == [0, 2, 4]
    assert [r.step for r in grads.param_history["0.weight"]] == [0, 3]
    statistics = layer_statistics(learn)
    assert statistics.activations is acts.recorder and statistics.gradients is grads.recorder
    assert all_hooks(learn.model) == 0


def test_the_old_module_path_and_stride_still_work_with_a_warning():
    import importlib
    import sys

    sys.modules.pop("hookscope.callbacks.monitor", None)
    with pytest.warns(DeprecationWarning, match="layer_stats"):
        monitor = importlib.import_module("hookscope.callbacks.monitor")
    assert monitor.ActivationStats is ActivationStats
    with pytest.warns(DeprecationWarning, match="every"):
        assert ActivationStats(every=4).stride == 4
