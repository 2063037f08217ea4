import random

from hookscope.doctor import rules
from hookscope.doctor.findings import Thresholds
from hookscope.doctor.history_codec import series_state
from hookscope.doctor.loss_history import LossHistory


def test_the_start_is_kept_whole_and_the_rest_thinned_to_an_even_density_spanning_the_run():
    history = LossHistory(head=4, size=64)
    history.extend((step, float(step)) for step in range(10_000))
    steps = [step for step, _ in history.entries]
    assert steps[:4] == [0, 1, 2, 3] and history.total == 10_000
    body = steps[4:]
    assert 16 < len(body) <= 64 and body == sorted(body)
    # an even density: each quarter of the run holds about a quarter of the kept losses
    quarters = [sum(1 for s in body if q * 2500 <= s < (q + 1) * 2500) for q in range(4)]
    assert all(abs(n - len(body) / 4) <= len(body) / 8 + 2 for n in quarters), quarters
    assert body[-1] > 9000


def test_it_resumes_exactly_and_an_old_full_series_is_bounded_as_it_loads():
    history = LossHistory(head=4, size=8)
    history.extend((step, 0.5) for step in range(50))
    resumed = LossHistory(head=4, size=8)
    resumed.load_state_dict(history.state_dict())
    for h in (history, resumed):
        h.extend((step, 0.5) for step in range(50, 90))
    assert resumed.entries == history.entries and resumed.level == history.level
    old_full = LossHistory(head=4, size=8)
    old = series_state([(step, 1.0) for step in range(1000)])  # a checkpoint that kept every loss
    old_full.load_state_dict(old)
    assert len(old_full) <= 12 and old_full.total == 1000


def test_the_loss_rules_keep_their_verdict_on_the_bounded_history():
    th = Thresholds()
    rng = random.Random(0)
    falling = [(s, 2.0 * 0.999**s + 0.05 * rng.random()) for s in range(20_000)]
    flat = [(s, 2.0 - 0.3 * min(s, 300) / 300 + 0.05 * rng.random()) for s in range(20_000)]
    # bounces, every other step high (an alternation every-k-th sampling would alias to a flat line)
    bouncing = [(s, 1.2 + (0.9 if s % 2 else 0.0) * rng.random() - 0.2 * rng.random()) for s in range(20_000)]
    for losses in (falling, flat, bouncing):
        bounded = LossHistory(head=64, size=1024)
        bounded.extend(losses)
        assert len(bounded) < len(losses) // 10
        full = [f.kind for f in rules.stalled_loss(losses, th)]
        assert [f.kind for f in rules.stalled_loss(bounded.entries, th)] == full
    assert [f.kind for f in rules.stalled_loss(flat, th)] == ["plateau"]
    assert [f.kind for f in rules.stalled_loss(bouncing, th)] == ["oscillating_loss"]
    assert rules.stalled_loss(falling, th) == []
