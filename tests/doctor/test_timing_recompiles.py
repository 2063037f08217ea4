"""recompiles: a compiled model whose batch shapes keep changing after warm-up is named with the guard that
failed and the fix; one recompilation for a short last batch, and validation's eval/no-grad variant, are
silent; a frame that reaches torch's recompile limit is said to run uncompiled.

The models are compiled with ``backend="eager"``: recompilations are dynamo's decision (its guards),
whatever the backend, and inductor would spend seconds of C++ compilation per graph on these two cores.
"""

import pytest
import torch
from timing_loops import Feed
from torch import nn

from hookscope import compat
from hookscope.doctor.timing import TimingRecorder

# the recorder's hooks are not traced (torch.compiler.disable): dynamo has nothing to warn of
# they measure time: run alone (`make test`'s second part)
pytestmark = [pytest.mark.filterwarnings("error:Dynamo does not know how to trace"), pytest.mark.serial]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing: dynamo's caches (and their recompile counts) are per code object,
    shared by every nn.Sequential of the process."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train_compiled(sizes, dynamic=None, valid_every=None, **options):
    """A compiled MLP trained one step per batch size in ``sizes``, fed to a TimingRecorder (attached to
    the user's module, as hs.watch does); ``valid_every``: an eval forward under no_grad every so many
    steps. Returns the Feed, closed, and its findings."""
    torch.set_num_threads(1)  # a few threads fighting over a busy machine's cores slow a tiny step 100x
    model = mlp()
    compiled = torch.compile(model, backend="eager", dynamic=dynamic)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, **options)
    for step, size in enumerate(sizes):
        x, y = torch.randn(size, 8), torch.randint(0, 4, (size,))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(compiled(x), y)
        feed.log(loss)
        loss.backward()
        opt.step()
        if valid_every and step % valid_every == valid_every - 1:
            model.eval()
            with torch.no_grad():
                compiled(torch.randn(32, 8))
            model.train()
    return feed, feed.close()


def test_changing_batch_shapes_after_warm_up_are_named_with_the_guard_and_the_fix():
    sizes = [32] * 12 + [32, 24, 16, 8] * 5  # new shapes from step 13 on, each compiled once
    _, found = train_compiled(sizes, dynamic=False)
    (finding,) = [f for f in found if f.kind == "recompiles"]
    assert finding.evidence["recompiles"] == 3
    assert finding.evidence["steps"] == [13, 14, 15]
    assert finding.step == 14  # the second recompilation after warm-up makes it clear
    assert finding.evidence["cause"] == "shape"
    assert finding.evidence["recompile_limit_hit"] is False
    assert all("size mismatch at index 0" in reason for reason in finding.evidence["reasons"])
    assert "compiled again in 3 steps after warm-up (steps 13, 14, 15)" in finding.message
    assert "dynamic=True" in finding.message and "torch._dynamo.mark_dynamic(x, 0)" in finding.message
    assert "drop_last=True" in finding.message


def test_steps_stalled_by_recompiling_name_the_recompilation():
    sizes = [32] * 120
    for step, size in zip(range(30, 120, 15), (24, 16, 8, 4, 2, 1), strict=True):
        sizes[step] = size  # a new shape every 15 steps: each one compiles while the step waits
    _, found = train_compiled(sizes, dynamic=False)
    stalls = {f.kind: f for f in found}["step_stalls"]
    recompiled = set(stalls.evidence["steps"]) & set(range(30, 120, 15))
    assert stalls.evidence["notes"]["recompilation"] == len(recompiled) >= 4
    assert f"recompilation ran in {len(recompiled)} of the" in stalls.message


def test_a_short_last_batch_and_validation_compile_once_and_stay_silent():
    epoch = [32] * 15 + [8]  # drop_last=False: automatic dynamic shapes recompile once, then fit all
    feed, found = train_compiled(epoch * 4, valid_every=16)
    assert [f.kind for f in found if f.kind == "recompiles"] == []
    recompiled = feed.recorder.recompiles.recompiles  # the short batch; the eval/no-grad variant is expected
    assert {r.step for r in recompiled} == {15}
    assert all("size mismatch" in r.reason for r in recompiled)


def test_reaching_the_recompile_limit_says_the_model_runs_uncompiled():
    limit = compat.recompile_limit()
    sizes = [32] * 10 + list(range(2, 2 + limit + 2))  # more distinct shapes than dynamo compiles
    _, found = train_compiled(sizes, dynamic=False)
    (finding,) = [f for f in found if f.kind == "recompiles"]
    assert finding.evidence["recompile_limit_hit"] is True
    assert finding.severity == "warning"
    assert f"reached torch's recompile limit ({limit}) and runs uncompiled" in finding.message


def test_the_recompilations_survive_a_checkpoint():
    feed, _ = train_compiled([32] * 12 + [32, 24, 16, 8], dynamic=False)
    state = feed.recorder.state_dict()
    restored = TimingRecorder()
    restored.load_state_dict(state)
    assert list(restored.recompiles.recompiles) == list(feed.recorder.recompiles.recompiles)


def test_compat_hears_each_compilation_and_keeps_the_failed_guard():
    heard = []
    stop = compat.on_compile_end(heard.append)
    compiled = torch.compile(mlp(), backend="eager", dynamic=False)
    compiled(torch.randn(4, 8))
    compiled(torch.randn(3, 8))
    stop()
    compiled(torch.randn(2, 8))
    assert [i.rsplit("/", 1)[1] for i in heard] == ["0", "1"]  # the third compilation was not heard
    records = {str(r.compile_id): r for r in compat.compile_records() if r.is_forward}
    assert records[heard[1]].recompile_reason.endswith("size mismatch at index 0. expected 4, actual 3")
    assert records[heard[0]].recompile_reason is None
    listening = compat.on_compile_end(heard.append)
    torch.compiler.reset()  # clears every listener: unregistering afterwards is a no-op
    listening()
