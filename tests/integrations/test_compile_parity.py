"""torch.compile parity: a compiled model gets the eager model's diagnosis — same kind, module name and
step — in the Learner and under hs.watch across the fault catalogue (``test_catalogue_loops``), the same
activation and gradient statistics under the same names, and
the Doctor costs dynamo nothing: the same frames, graphs and graph breaks as the model alone, no
recompilation, nothing of hookscope's traced (dynamo's own counters and compile listener).

The models are compiled with ``backend="eager"``: which graphs dynamo builds and when it recompiles is
decided by its guards whatever the backend; inductor would add seconds of C++ compilation per graph.
"""

import warnings
from dataclasses import replace

import pytest
import torch
from faults import StopAfter, dead_mlp, digits_flat
from test_catalogue_loops import CATALOGUE, findings_in
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

import hookscope as hs
from hookscope import compat

pytestmark = pytest.mark.usefixtures("deterministic")

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


class Net(nn.Module):
    """The digits MLP as a model of one's own (not a torch.nn container): dynamo compiles its forward and
    leaves the calls of its hooks to torch."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


BUILDS = {"own module": Net, "nn.Sequential": dead_mlp}
STEPS = 120  # the Doctor's hooks on for steps 0-4, off, on again at 50 and 100


def whole_batches() -> DataLoader:
    x, y = digits_flat().train.dataset.tensors
    return DataLoader(TensorDataset(x, y), batch_size=64, drop_last=True)


def fit_in_learner(model, doctor: bool):
    """Fit for STEPS steps; with ``doctor``, its findings and activation statistics."""
    doctors = [hs.callbacks.Doctor(quiet=True, check_every=3)] if doctor else []
    learn = hs.Learner(model, hs.DataLoaders(whole_batches(), None), nn.CrossEntropyLoss(), cbs=doctors)
    learn.fit(6, cbs=[StopAfter(STEPS)])
    return (learn.doctor.findings, learn.doctor.activations.history) if doctor else None


def fit_in_plain_loop(model, doctor: bool):
    """The same under ``hs.watch`` (or nothing)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = hs.watch(model, opt, quiet=True) if doctor else None
    batches = (batch for _ in range(6) for batch in whole_batches())
    for _, (x, y) in zip(range(STEPS), batches, strict=False):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if watch is not None:
            watch.log(loss.detach(), y)
    if watch is None:
        return None
    watch.close()
    return watch.findings, watch.activations


def what_dynamo_did(build, fit, doctor: bool):
    """Train a fresh compiled model; dynamo's own counts: the compile ids of the frames it compiled,
    the graphs it built, its graph breaks, its warnings, and what the loop returned."""
    torch.compiler.reset()
    counters.clear()
    compiles = []
    stop = compat.on_compile_end(compiles.append)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            watched = fit(torch.compile(build(), backend="eager"), doctor)
    finally:
        stop()
    said = [str(w.message) for w in caught if "Dynamo" in str(w.message) or "dynamo" in str(w.filename)]
    breaks = sum(counters["graph_break"].values())
    return compiles, counters["stats"]["unique_graphs"], breaks, said, watched


def recompiled(compile_ids: list[str]) -> list[str]:
    """The compilations of a frame compiled before (``"frame/n"``, n >= 1)."""
    return [c for c in compile_ids if not c.endswith("/0")]


@pytest.mark.parametrize("model", list(BUILDS))
@pytest.mark.parametrize("loop", ["learner", "plain"])
def test_the_doctor_adds_no_recompilation_and_no_graph_to_a_compiled_model(loop, model):
    fit = {"learner": fit_in_learner, "plain": fit_in_plain_loop}[loop]
    bare_compiles, bare_graphs, bare_breaks, _, _ = what_dynamo_did(BUILDS[model], fit, doctor=False)
    compiles, graphs, breaks, said, (findings, activations) = what_dynamo_did(BUILDS[model], fit, doctor=True)
    assert recompiled(compiles) == recompiled(bare_compiles) == []
    assert graphs == bare_graphs == 1  # the whole model in one graph, as without the Doctor
    # nn.Sequential's forward is torch's own: dynamo wraps the call and meets the root's hooks, one break
    assert breaks == bare_breaks + (model == "nn.Sequential")
    assert said == []  # nothing of hookscope's traced: no "does not know how to trace" warning
    assert "recompiles" not in {f.kind for f in findings}
    torch.manual_seed(0)
    _, eager = fit(BUILDS[model](), doctor=True)
    assert activations.keys() == eager.keys()
    for name, records in eager.items():  # recorded steps 0-4, 50 and 100, and the eager model's values
        assert [r.step for r in activations[name]] == [r.step for r in records] == [*range(5), 50, 100]
        assert [r.stats.mean for r in activations[name]] == pytest.approx([r.stats.mean for r in records])
