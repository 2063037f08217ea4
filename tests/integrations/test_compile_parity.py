"""torch.compile parity: a compiled model gets the eager model's diagnosis — same kind, module name and
step — in the Learner and under hs.watch across the fault catalogue (``test_catalogue_loops``), the same
activation and gradient statistics under the same names, and
hookscope's hooks make no recompilation after the warm-up, the model's own graph keeping at most two
variants (measured with the ``recompiles`` detector's compile listener).

The models are compiled with ``backend="eager"``: which graphs dynamo builds and when it recompiles is
decided by its guards whatever the backend; inductor would add seconds of C++ compilation per graph.
"""

from dataclasses import replace

import pytest
import torch
from faults import dead_mlp, digits_flat, train_with_doctor
from test_catalogue_loops import CATALOGUE, findings_in
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope import compat

pytestmark = [
    pytest.mark.usefixtures("deterministic"),
    # hookscope's statistics call a cached pure-Python layout helper that dynamo traces through
    pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
]

WARMUP = 10  # the doctor's first recorded steps, and the timing rules' warm-up
REPRESENTATIVE = [  # one fault of each family: statistics, gradients, NaN, loop protocol, data, healthy
    "dead_units",
    "exploding",
    "forward_nan",
    "frozen",
    "zero_grad_missing",
    "sorted_labels",
    "healthy",
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each run compiles from nothing: dynamo's caches and recompile counts are per code object, shared by
    every nn.Sequential of the process."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def compiled(case):
    return replace(case, build=lambda: torch.compile(case.build(), backend="eager"))


@pytest.mark.parametrize(
    "fault", ["dead_units", *(pytest.param(f, marks=pytest.mark.slow) for f in REPRESENTATIVE[1:])]
)
@pytest.mark.parametrize("loop", ["learner", "plain"])
def test_a_compiled_model_gets_the_eager_diagnosis(loop, fault, tmp_path):
    case = CATALOGUE[fault]
    eager = [(f.kind, f.module, f.step) for f in findings_in(loop, case, tmp_path)]
    assert (case.expected is None) or case.expected[:1] in {k[:1] for k in eager}
    assert [(f.kind, f.module, f.step) for f in findings_in(loop, compiled(case), tmp_path)] == eager


def statistics(compiled):
    torch.manual_seed(0)
    model = dead_mlp()
    stats = [hs.callbacks.ActivationStats(), hs.callbacks.GradientStats()]
    learn = hs.Learner(
        torch.compile(model, backend="eager") if compiled else model,
        digits_flat(),
        torch.nn.CrossEntropyLoss(),
        cbs=stats,
        progress=False,
    )
    learn.fit(1)
    return [{name: [(r.step, r.stats.mean) for r in rs] for name, rs in s.history.items()} for s in stats]


def test_statistics_of_a_compiled_model_are_the_eager_ones_under_the_same_names():
    eager = statistics(compiled=False)
    compiled = statistics(compiled=True)
    assert set(eager[0]) == set(compiled[0]) == {"0", "2", "4"}  # no `_orig_mod.` prefix
    for eager_history, compiled_history in zip(eager, compiled, strict=True):
        assert set(compiled_history) == set(eager_history)
        for name, records in eager_history.items():
            steps, means = zip(*records, strict=True)
            assert [r[0] for r in compiled_history[name]] == list(steps)
            assert [r[1] for r in compiled_history[name]] == pytest.approx(means, rel=1e-5, abs=1e-7)


def test_hookscope_makes_no_recompilation_after_warm_up():
    """120 steps of whole batches: the Doctor's hooks on for the first 10, off, on at steps 50 and 100."""
    compiles, step = [], hs.Callback()
    step.at = 0
    step.before_batch = lambda: setattr(step, "at", step.learn.training_step)
    x, y = digits_flat().train.dataset.tensors
    data = hs.DataLoaders(DataLoader(TensorDataset(x, y), batch_size=64, drop_last=True), None)
    stop = compat.on_compile_end(lambda compile_id: compiles.append((step.at, compile_id)))
    try:
        torch.manual_seed(0)
        train_with_doctor(torch.compile(dead_mlp(), backend="eager"), data, steps=120, epochs=6, cbs=[step])
    finally:
        stop()
    assert [c for c in compiles if c[0] >= WARMUP] == []
    assert len([c for _, c in compiles if c.startswith("0/")]) <= 2  # the model's frame: its variants
