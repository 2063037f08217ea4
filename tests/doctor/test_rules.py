"""The rules on hand-made statistics: what fires, what stays quiet, and which layer gets named."""

import itertools
import math
import statistics

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.doctor.findings import Thresholds
from hookscope.doctor.record_types import ParamRecord, StepStats
from hookscope.doctor.rules import (
    DIVERGENCE_NOISE,
    NOISE_MIN,
    NOISE_SPAN,
    DivergenceScan,
    OutputShapes,
    dead_units,
    exploding_gradient,
    falling_trend,
    loss_divergence,
    no_gradient,
    stalled_loss,
    update_ratio,
    vanishing_gradient,
)
from hookscope.hooks.stats import RunningStats

TH = Thresholds()


def _stats(step, tensor):
    rs = RunningStats()
    rs.update(tensor)
    return StepStats(step, rs.read())


def test_dead_units_needs_patience_and_reports_only_the_head_of_a_dead_chain():
    torch.manual_seed(0)
    alive = torch.rand(8, 4) + 0.1
    dead = torch.cat([torch.zeros(8, 3), torch.rand(8, 1)], dim=1)  # 3 of 4 units dead
    history = {
        "fc": [_stats(s, alive) for s in range(4)],
        "relu": [_stats(0, alive)] + [_stats(s, dead) for s in (1, 2, 3)],
        "pool": [_stats(0, alive)] + [_stats(s, dead) for s in (1, 2, 3)],
    }
    (finding,) = dead_units(history, TH)
    assert (finding.module, finding.step, finding.evidence["producer"]) == ("relu", 1, "fc")
    assert finding.evidence["dead_fraction"] == 0.75 and "75% of units dead since step 1" in finding.message
    short = {name: records[:3] for name, records in history.items()}  # dead for only 2 steps
    assert dead_units(short, TH) == []


def test_loss_divergence_ignores_noise_and_names_the_step_it_took_off():
    noisy = [(s, 2.0 - 0.05 * s + (0.3 if s % 3 == 0 else -0.3)) for s in range(30)]
    assert loss_divergence(noisy, TH) == []
    rising = [(s, 2.0) for s in range(5)] + [(5 + s, 2.0 * 3.0**s) for s in range(6)]
    (finding,) = loss_divergence(rising, TH)
    assert finding.kind == "loss_divergence" and finding.step == 7
    assert loss_divergence([(0, 1.0), (1, math.nan)] * 4, TH) == []  # NaN is the guard's business


# finetune_low_lr's first 30 losses (tests/doctor/odd_runs.py, the Learner's order): a pretrained MLP at
# lr 1e-5, each batch's loss carried by its one or two errors
NEAR_ZERO = [0.056, 0.017, 0.101, 0.093, 0.239, 0.126, 0.070, 0.011, 0.100, 0.109, 0.117, 0.136, 0.198]
NEAR_ZERO += [0.115, 0.050, 0.085, 0.018, 0.348, 0.040, 0.039, 0.393, 0.179, 0.147, 0.046, 0.061, 0.167]
NEAR_ZERO += [0.032, 0.265, 0.031, 0.140]


def test_a_rise_within_the_batch_noise_of_a_loss_near_zero_is_no_divergence():
    # 0.24 at step 22 is 4.7x its best window (0.051) and above its start (0.058), but only 2.9x the
    # median change from one loss to the next (0.064): the batches differ by that much all along
    assert loss_divergence(list(enumerate(NEAR_ZERO)), TH) == []
    rising = [*NEAR_ZERO[:20], 0.5, 1.0, 2.0, 2.5, 3.0]  # the same noise, then a rise of 30x it
    (finding,) = loss_divergence(list(enumerate(rising)), TH)
    assert finding.step == 21 and finding.evidence["noise"] > 0.05
    assert "its batch-to-batch noise" in finding.message
    # the lr 1000x too high of the catalogue (test_catalogue.py), its noise the rise's own first steps
    (steep,) = loss_divergence(list(enumerate([2.3, 13.5, 34.3, 791.0, 154.0, 4.53, 6.35])), TH)
    assert steep.step == 3


def test_a_loss_below_zero_has_no_floor_to_diverge_from():
    """REINFORCE (pytorch/examples reinforcement_learning/reinforce.py): minus the log-probabilities times
    the episode's normalised returns, summed — noise around zero, negative about half the time. Its
    smoothed value at -0.33 made any value "far above" 4 x its best (-1.3): a divergence at step 2."""
    surrogate = [-0.41, -0.25, -0.33, 0.12, -0.08, 0.31, -0.52, 0.05, 0.22, -0.17, 0.40, -0.29, 0.15, 0.33]
    assert loss_divergence(list(enumerate(surrogate)), TH) == []
    # a non-negative loss that reached exactly zero (a hinge loss) still has its floor
    hinge = [1.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 3.0, 4.0]
    assert [f.step for f in loss_divergence(list(enumerate(hinge)), TH)] == [10]


def test_a_blow_up_that_falls_back_is_a_divergence_its_own_rise_being_no_noise():
    # an MLP on digits with SGD at lr 10 (tests/integrations/optuna_support.py): the loss shoots up to
    # 741 in four steps and falls back near chance with 97% of the units dead; a noise measured over the
    # rise itself (median change 62) hid it
    blow_up = [2.36, 8.06, 76.4, 131.3, 740.8, 4.54, 4.12, 3.16, 2.70, 2.71, 2.77, 2.47, 2.34, 2.44, 2.41]
    (finding,) = loss_divergence(list(enumerate(blow_up)), TH)
    assert finding.step == 4 and finding.severity == "error"
    late = [*NEAR_ZERO[:20], 0.5, 1.0, 2.0, 2.5, 3.0, 0.2, 0.1]  # after a measured noise: the same verdict
    assert [f.step for f in loss_divergence(list(enumerate(late)), TH)] == [21]


def _first_divergence(values, window=3, factor=4.0, noise=DIVERGENCE_NOISE):
    """The rule's definition, written plainly over the whole history: the step of the first smoothed
    loss above ``factor`` x the best smoothed loss until then, and above the first one by more than
    ``noise`` x the median change between consecutive losses among the last NOISE_SPAN until then, less
    the ``window`` changes of the rise itself (fewer than NOISE_MIN left: the ratio to the best alone)."""
    if len(values) < 2 * window or not all(math.isfinite(v) for v in values):
        return None
    means = [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]
    changes = [abs(b - a) for a, b in itertools.pairwise(values)]
    for i, mean in enumerate(means):
        end = i + window - 1  # the step of this mean's last loss: changes[end - 1] is its change
        before = changes[max(0, end - NOISE_SPAN) : end][:-window]
        rose = len(before) < NOISE_MIN or mean - means[0] > noise * statistics.median(before)
        best = min(means[: i + 1])
        if best < 0:  # a loss below zero has no floor to rise from: silent from then on
            return None
        if mean > factor * best and rose:
            return end
    return None


# a few levels far apart, so that falls, rises and starts above the best are common; now and then NaN/Inf,
# and now and then below zero
losses = st.lists(
    st.sampled_from([-1.0, 0.1, 1.0, 2.0, 3.0, 8.0, 30.0, math.inf, math.nan]) | st.floats(-5, 100),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(losses, st.lists(st.integers(1, 7), max_size=10))
def test_the_divergence_scan_fed_piece_by_piece_finds_the_first_divergence_of_the_whole_history(values, cuts):
    history, scan, end = [], DivergenceScan(TH.loss_window, TH.divergence_factor), 0
    for cut in [*cuts, len(values)]:  # a check after each piece of the history
        piece = [(step, v) for step, v in enumerate(values[end : end + cut], start=end)]
        history += piece
        end = len(history)
        scan.update(piece)  # only the losses since the last check, as the engine feeds it
        expected = _first_divergence([v for _, v in history])
        assert [f.step for f in scan.findings()] == ([] if expected is None else [expected])


def _grads(scales, steps=3):
    return {
        name: [_stats(s, torch.full((64,), -scale)) for s in range(steps)] for name, scale in scales.items()
    }


def test_exploding_growth_is_searched_from_the_loss_backwards():
    scales = {"l0": 1e4, "l1": 1e3, "l2": 30.0, "l3": 3.0, "l4": 1.0}  # gradient RMS, l4 nearest the loss
    (finding,) = exploding_gradient({}, _grads(scales), TH)
    assert finding.module == "l1" and finding.evidence["growth"] == 1e3
    assert set(finding.evidence["layers"]) == {"l0", "l1"}
    narrow_head = OutputShapes({"l3": 64, "l4": 10}, set())  # 10 classes from 64 features: as it is
    assert exploding_gradient({}, _grads(scales), TH, narrow_head)[0].evidence["growth"] == 1e3


def test_the_gradient_norm_bar_is_per_unit_of_the_loss_at_its_start():
    norms = {"fc1": [(s, 5e3) for s in range(3)], "fc4": [(s, 3e3) for s in range(3)]}
    summed = [(s, 7e4 - 1e3 * s) for s in range(3)]  # vae/main.py: the BCE summed over batch and pixels
    assert exploding_gradient(norms, {}, TH, losses=summed) == []
    (mean,) = exploding_gradient(norms, {}, TH, losses=[(s, 2.3) for s in range(3)])  # a mean: 2.3e3
    assert mean.module == "fc4" and mean.evidence["loss_unit"] == 2.3 and "fc1" in mean.evidence["layers"]
    near_zero = [(s, 1e-3) for s in range(3)]  # a start below 1 keeps the absolute bar, as no losses do
    assert exploding_gradient(norms, {}, TH, losses=near_zero)[0].evidence["loss_unit"] == 1.0
    assert exploding_gradient(norms, {}, TH)[0].evidence["loss_unit"] == 1.0
    blown = {"fc4": [(0, 2e3), (1, 8e7), (2, 9e7)]}  # the summed loss's gradients 1e4x their start
    (finding,) = exploding_gradient(blown, {}, TH, losses=summed)
    assert finding.step == 1 and "per unit of the loss, which started at 6.9e+04" in finding.message


def test_a_large_vocabulary_head_and_a_batch_shared_output_are_no_explosion():
    # GPT-2 from scratch at step 0 (measured, per value): the logits' gradient ~1/V, the residual stream's
    # ~150x that, the position embedding's (1, T, d) output summed over a batch of 16
    scales = {"wte": 1.4e-3, "wpe": 6e-3, "h.0.mlp": 1.3e-3, "ln_f": 3.9e-5, "lm_head": 8.7e-6}
    widths = {"wte": 32 * 64, "wpe": 32 * 64, "h.0.mlp": 32 * 64, "ln_f": 32 * 64, "lm_head": 32 * 50257}
    assert exploding_gradient({}, _grads(scales), TH, OutputShapes(widths, {"wpe"})) == []
    (head,) = exploding_gradient({}, _grads(scales), TH)  # the head's 1/V as the yardstick
    assert head.module == "h.0.mlp" and head.evidence["layers"]["wpe"] > 600
    huge_batch = {**scales, "wpe": 6e-3 * 8}  # the sum over 1024 examples, not 16
    assert exploding_gradient({}, _grads(huge_batch), TH, OutputShapes(widths, {"wpe"})) == []
    (summed,) = exploding_gradient({}, _grads(huge_batch), TH, OutputShapes(widths, set()))
    assert summed.module == "wpe"


def test_vanishing_names_the_earliest_layer_and_skips_exact_zeros():
    rms = {
        "a": [(s, 1e-9) for s in range(3)],
        "b": [(s, 0.0) for s in range(3)],
        "c": [(s, 1.0) for s in range(3)],
    }
    (finding,) = vanishing_gradient(rms, TH)
    assert finding.module == "a" and finding.evidence["layers"] == ["a"]
    dead_first = {"z": [(s, 0.0) for s in range(3)], **rms}  # a layer with no gradient at all comes first
    assert vanishing_gradient(dead_first, TH)[0].module == "a"


def test_a_small_gradient_only_in_the_middle_of_the_model_is_not_vanishing():
    """The attention's query and key of a fresh transformer: tiny gradients between layers that learn."""
    rms = {
        "embed": [(s, 1e-2) for s in range(3)],
        "query": [(s, 1e-8) for s in range(3)],
        "value": [(s, 1e-2) for s in range(3)],
        "head": [(s, 1.0) for s in range(3)],
    }
    assert vanishing_gradient(rms, TH) == []
    rms["embed"] = [(s, 1e-9) for s in range(3)]  # the gradient also fails to reach the first layer
    (finding,) = vanishing_gradient(rms, TH)
    assert finding.module == "embed" and finding.evidence["layers"] == ["embed", "query"]


def test_no_gradient_and_update_ratio_on_parameter_records():
    params = {
        "used.weight": [ParamRecord(s, 0.5, 1e-3) for s in range(3)],
        "branch.weight": [ParamRecord(s, None, 0.0) for s in range(3)],
        "branch.bias": [ParamRecord(s, None, 0.0) for s in range(3)],
        "fast.weight": [ParamRecord(s, 0.5, 0.9) for s in range(3)],
    }
    (missing,) = no_gradient(params, TH)
    assert missing.module == "branch" and missing.evidence["parameters"] == ["branch.weight", "branch.bias"]
    matrices = {"used.weight", "branch.weight", "fast.weight"}
    (ratio,) = update_ratio(params, matrices, TH)
    assert (ratio.module, ratio.evidence["update_ratio"]) == ("fast", 0.9) and "too large" in ratio.message


def test_a_matrix_that_starts_at_zero_is_judged_once_it_has_grown():
    """A ViT's position embedding (torch.zeros) under AdamW with a linear warm-up: each of the first steps
    changes it by 2/(n+1) of its size, the whole of it at the first. Records at steps 0-4 (the warm-up),
    then every 50th."""
    grown = [ParamRecord(s, 0.1, 2 / (s + 2)) for s in range(5)] + [
        ParamRecord(s, 0.1, 0.02) for s in (50, 100)
    ]
    for seen in (5, 6, 7):  # the checks at step 4, after the record of step 50, after that of step 100
        assert update_ratio({"pos": grown[:seen]}, {"pos"}, TH) == []
    # its learning rate far too high: the ratio stays large once it has grown, and that is named
    hot = grown[:5] + [ParamRecord(s, 0.1, 0.9) for s in (50, 100, 150)]
    (finding,) = update_ratio({"pos": hot}, {"pos"}, TH)
    assert finding.step == 50 and finding.evidence["update_ratio"] == 0.9
    # a matrix that did not start at zero is judged from its first records, as before
    started = [ParamRecord(s, 0.1, 0.5) for s in range(1, 5)]
    assert [f.step for f in update_ratio({"w": started}, {"w"}, TH)] == [2]


def _noisy(level, slope, n=100, noise=0.05, seed=0):
    """``n`` losses ``level + slope * i`` plus Gaussian batch noise of ``noise``."""
    gen = torch.Generator().manual_seed(seed)
    return [level + slope * i + noise * float(e) for i, e in enumerate(torch.randn(n, generator=gen))]


def test_a_slow_steady_fall_under_noise_is_falling_not_a_plateau():
    # 2.30 -> 2.28 over the last 50 steps (under 1% a window, far below stall_drop), noise 0.05
    slow = _noisy(2.32, -0.0004, n=100, seed=1)
    assert falling_trend(slow[-50:]) < -TH.trend_z
    assert stalled_loss(list(enumerate(slow)), TH) == []


def test_flat_noise_is_a_plateau_and_a_bounce_is_oscillating():
    flat = _noisy(2.3, 0.0, seed=2)
    assert abs(falling_trend(flat[-50:])) < TH.trend_z
    (plateau,) = stalled_loss(list(enumerate(flat)), TH)
    assert plateau.kind == "plateau" and plateau.evidence["trend_z"] > -TH.trend_z
    bouncing = [2.0 if i < 3 else 2.0 * (1.5 if i % 2 else 0.5) for i in range(100)]  # calm at first
    assert abs(falling_trend(bouncing)) < 1.0
    (bounce,) = stalled_loss(list(enumerate(bouncing)), TH)
    assert bounce.kind == "oscillating_loss"


def test_a_loss_that_bounces_from_its_first_values_fits_already_and_is_not_stalled():
    # finetune_low_lr: flat and bouncing by ~140% of its median, but about as much from its first three
    # losses on (range 150%) — a pretrained model's batch noise, not a stall
    near_zero = (NEAR_ZERO * 3)[:90]
    assert stalled_loss(list(enumerate(near_zero)), TH) == []
    lucky = [0.08, 0.1, 0.12]  # three close batches: a range of 40%, still over a quarter of the bounce
    assert stalled_loss(list(enumerate(lucky + near_zero[3:])), TH) == []
    for calm in ([0.1] * 3, [0.095, 0.1, 0.105]):  # 0% and 10%: the bounce grew since the start
        (bounce,) = stalled_loss(list(enumerate(calm + near_zero[3:])), TH)
        assert bounce.kind == "oscillating_loss" and bounce.evidence["spread"] > 1.0


def test_the_trend_reads_ranks_so_spikes_do_not_make_a_fall():
    rising_spikes = [2.3] * 10 + [9.0] * 3 + _noisy(2.3, 0.0, n=37, seed=3)  # spikes early, then flat
    assert falling_trend(rising_spikes) > -TH.trend_z
    assert falling_trend([3.0, 2.0, 1.0]) < 0 and falling_trend([1.0] * 20) == 0.0
    assert falling_trend(list(range(50, 0, -1))) < -9  # a strict fall: S = -n(n-1)/2
