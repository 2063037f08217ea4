"""hookscope's hooks on a ``torch.compile``d model: dynamo does not trace them (no guard on their
state, no recompilation), and switched hooks run the compiled code eagerly while they are on, so the
compiled graph never holds them. Counted with dynamo's own compile listener (``backend="eager"``: the
guards and graphs are dynamo's whatever the backend)."""

import pytest
import torch
from torch import nn

from hookscope import compat
from hookscope.hooks.handles import HookSet, SwitchedHooks


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.fixture
def compiles():
    """The compile ids of every frame dynamo compiles during the test."""
    seen: list[str] = []
    stop = compat.on_compile_end(seen.append)
    yield seen
    stop()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_hook_whose_state_changes_every_call_compiles_nothing_again(compiles):
    net, calls = Net(), []

    def count(module, args, output):  # traced, dynamo would guard on len(calls) and recompile each call
        calls.append((len(calls), output.detach().sum().item()))

    model = torch.compile(net, backend="eager")
    with HookSet() as hooks:
        hooks.forward(net.fc1, count)
        hooks.forward_pre(net.fc1, lambda m, args: calls.append((len(calls), None)))
        xs = [torch.randn(3, 4) for _ in range(12)]
        outs = [model(x) for x in xs]
    assert [c for c in compiles if not c.endswith("/0")] == []
    assert [i for i, _ in calls] == list(range(24))  # both hooks ran at every call, in order
    assert [s is None for _, s in calls] == [True, False] * 12
    assert [s for _, s in calls[1::2]] == pytest.approx([net.fc1(x).sum().item() for x in xs])
    assert all(torch.equal(o, net(x)) for o, x in zip(outs, xs, strict=True))


def test_compiled_code_runs_eagerly_while_switched_hooks_are_on(compiles):
    net, seen = Net(), []
    model = torch.compile(net, backend="eager")
    first, second = SwitchedHooks(), SwitchedHooks()
    first.targets([(net.fc1, lambda m, a, o: seen.append("fc1"))])
    second.targets([(net.fc2, lambda m, a, o: seen.append("fc2"))])
    x = torch.randn(3, 4)
    first.switch(True)
    second.switch(True)
    model(x)
    first.switch(False)
    model(x)  # the second still on: still eager
    assert compiles == [] and seen == ["fc1", "fc2", "fc2"]
    second.switch(False)
    model(x)
    assert compiles == ["0/0"] and seen == ["fc1", "fc2", "fc2"]
    first.switch(True)
    model(x)  # eager again, the hook runs; the graph compiled without hooks is left as it is
    first.clear()
    model(x)
    assert compiles == ["0/0"] and seen == ["fc1", "fc2", "fc2", "fc1"]


def test_a_switched_owner_dropped_after_its_step_leaves_the_process_compiling(compiles):
    net = Net()
    model = torch.compile(net, backend="eager")
    hooks = SwitchedHooks()
    hooks.targets([(net.fc1, lambda m, a, o: None)])
    hooks.switch(True)
    model(torch.randn(3, 4))
    hooks.rest()  # the recorded step ended; its owner is never called again
    assert compiles == []
    other = torch.compile(Net(), backend="eager")
    other(torch.randn(3, 4))
    assert compiles == ["0/0"]  # another compiled model is compiled again


def test_switching_off_gives_back_the_users_own_stance(compiles):
    net = Net()
    model = torch.compile(net, backend="eager")
    hooks = SwitchedHooks()
    hooks.targets([(net.fc1, lambda m, a, o: None)])
    with torch.compiler.set_stance("force_eager"):
        hooks.switch(True)
        hooks.switch(False)
        model(torch.randn(3, 4))
        assert compiles == []  # still the user's force_eager
    model(torch.randn(3, 4))
    assert compiles == ["0/0"]
