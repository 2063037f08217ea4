"""``slow_layers``: the few modules that take most of the forward and backward time, from a short
profiled window — on request (``Doctor(profile=True)``, ``hookscope train --profile``), and once by
itself when the steps grew slower than at the start of the run for no other reason (:mod:`~.slowdown`).

:class:`ProfileWindow` profiles :data:`STEPS` training steps once the warm-up is over, with
``torch.profiler`` (CPU, and CUDA kernels on a GPU). Forward hooks on every leaf module open and close a
``record_function`` range named after it; the backward is joined to the module through autograd's
sequence numbers (each forward op records the number of the autograd node it creates; the backward
event ``autograd::engine::evaluate_function: XBackward0`` that runs that node carries the same number).
``torch.profiler``'s own ``with_modules`` names modules for TorchScript only, hence the ranges. After the
window the profiler stops and the hooks are removed: nothing stays on.

:func:`slow_layers` names the modules, largest first, until they cover :data:`COVER` of the time (at
most :data:`TOP`), each with its share, and the usual fix for its type.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from hookscope.doctor.findings import Finding
from hookscope.doctor.timing.slowdown import Growth
from hookscope.hooks.handles import HookSet
from hookscope.hooks.select import select

STEPS = 5
TOP = 3
COVER = 0.5
RANGE = "hookscope.module:"  # the prefix of the ranges the hooks open
BACKWARD = "autograd::engine::evaluate_function: "

FIXES = (  # (type names containing, the usual fix), the first match wins
    (("Conv",), "channels_last memory format and mixed precision (torch.autocast); cudnn.benchmark on CUDA"),
    (("Attention",), "F.scaled_dot_product_attention (fused flash/memory-efficient kernels)"),
    (("LSTM", "GRU", "RNN"), "cuDNN's fused kernels on CUDA, packed sequences, or a shorter sequence"),
    (("Linear", "Bilinear"), "mixed precision (torch.autocast to bf16/fp16) or TF32 matmuls on CUDA"),
    (("Embedding",), "a smaller vocabulary or sparse gradients (sparse=True with a sparse optimizer)"),
    (("Norm",), "torch.compile to fuse it with its neighbours"),
)
DEFAULT_FIX = "torch.compile to fuse it, mixed precision, or a smaller layer"
GROWING = (
    "and since the steps grew slower, look first for what grows in these modules: a cache, a history or "
    "a memory kept across steps (bound it), or inputs that grow (a longer sequence)"
)


class ProfileWindow:
    r"""Once :meth:`request`\ ed, profiles ``steps`` training steps from step ``start`` on, once.
    ``note(event)`` is told when the window opens (a stall in it names the profiler)."""

    def __init__(self, note: Callable[[str], None] | None = None) -> None:
        self.start: int | None = None  # not requested
        self.steps = STEPS
        self.times: dict[str, float] | None = None  # module -> seconds per step, forward and backward
        self.kinds: dict[str, str] = {}  # module -> type name
        self.profiled: list[int] = []
        self.growth: Growth | None = None  # why the window was opened without a request
        self._note = note
        self._model: nn.Module | None = None
        self._cuda = False
        self._hooks = HookSet()
        self._open: dict[str, list[Any]] = defaultdict(list)
        self._profiler: profile | None = None
        self._step = 0  # the training step running now

    def request(self, start: int, steps: int = STEPS, growth: Growth | None = None) -> None:
        """Profile ``steps`` training steps from step ``start`` on (a window already read is read again);
        ``growth``: the slowdown that opens it, when nobody asked."""
        if steps < 1:
            raise ValueError(f"profile_layers: steps={steps}; profile at least one step (steps >= 1)")
        self.start, self.steps, self.times, self.profiled = start, steps, None, []
        self.growth = growth

    def attach(self, model: nn.Module, cuda: bool) -> None:
        self._model, self._cuda = model, cuda

    def begin_batch(self, step: int) -> None:
        """Open the window at the first training step at or after ``start``."""
        waiting = self._profiler is None and self.times is None and self.start is not None
        if waiting and step >= self.start and self._model is not None:
            self._begin()
        self._step = step

    def end_batch(self) -> None:
        """A training step ended: counted when profiled; the window closes after ``steps`` of them."""
        if self._profiler is None:
            return
        self.profiled.append(self._step)
        if len(self.profiled) >= self.steps:
            self.close()

    def close(self) -> None:
        """Stop the profiler, remove the hooks and read the modules' times (a window cut short counts
        the steps it saw)."""
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        self._hooks.remove()
        self._open.clear()
        self.times = _per_step(module_times(profiler.events(), self._cuda), max(len(self.profiled), 1))

    def dismiss(self) -> None:
        """Forget the modules' times: the window reports nothing, and it was read (it does not open
        again)."""
        self.times = {}

    def finding(self) -> Finding | None:
        """:func:`slow_layers` once the window is read."""
        if self.times is None:
            return None
        return slow_layers(self.times, self.kinds, self.profiled, self.growth)

    def _begin(self) -> None:
        for name, module in select(self._model, None):
            self.kinds[name] = type(module).__name__
            self._hooks.forward_pre(module, self._enter(name))
            self._hooks.forward(module, self._exit(name), always_call=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._profiler = profile(activities=activities)
        self._profiler.__enter__()
        if self._note is not None:
            self._note("the profiler (slow_layers)")

    def _enter(self, name: str) -> Callable[..., None]:
        def enter(module: nn.Module, args: Any) -> None:
            scope = record_function(RANGE + name)
            scope.__enter__()
            self._open[name].append(scope)

        return enter

    def _exit(self, name: str) -> Callable[..., None]:
        def exit_(module: nn.Module, args: Any, output: Any) -> None:
            if self._open[name]:
                self._open[name].pop().__exit__(None, None, None)

        return exit_


def module_times(events: Any, cuda: bool) -> dict[str, float]:
    """Seconds per module in a profiler's ``events()``: each module's ranges (forward) and the backward
    nodes created by the ops inside them (joined by sequence number). On CUDA the kernels' device time,
    on the CPU the host time."""
    seconds: dict[str, float] = defaultdict(float)
    owner: dict[int, str] = {}  # autograd sequence number -> module whose forward created the node
    for event in events:
        if not event.name.startswith(RANGE):
            continue
        name = event.name[len(RANGE) :]
        seconds[name] += _time(event, cuda)
        for op in _descendants(event):
            if op.sequence_nr >= 0:
                owner.setdefault(op.sequence_nr, name)
    for event in events:
        if event.name.startswith(BACKWARD) and event.sequence_nr in owner:
            seconds[owner[event.sequence_nr]] += _time(event, cuda)
    return dict(seconds)


def slow_layers(
    times: dict[str, float], kinds: dict[str, str], steps: list[int], growth: Growth | None = None
) -> Finding | None:
    """The modules that take most of the forward and backward time, largest first: until they cover
    :data:`COVER` of it, at most :data:`TOP`; ``growth``: the slowdown that opened the window."""
    total = sum(times.values())
    if total <= 0:
        return None
    ranked = sorted(times.items(), key=lambda kv: kv[1], reverse=True)
    named: list[tuple[str, float]] = []
    for name, seconds in ranked[:TOP]:
        named.append((name, seconds / total))
        if sum(share for _, share in named) >= COVER:
            break
    modules = _join([f"`{name}` ({kinds.get(name, '?')})" for name, _ in named])
    shares = _join([f"{share:.0%}" for _, share in named])
    fixes = [f"`{name}`: {_fix(kinds.get(name, ''))}" for name, _ in named]
    if growth is not None:
        fixes.append(GROWING)
    verb = "takes" if len(named) == 1 else "take"
    message = (growth.describe() if growth is not None else "") + (
        f"{modules} {verb} {shares} of the forward and backward time (profiled steps {steps[0]}-{steps[-1]}, "
        f"{total * 1e3:.1f} ms per step in {len(times)} modules). The usual fix: " + "; ".join(fixes) + "."
    )
    evidence = {
        "shares": {name: round(share, 4) for name, share in named},
        "ms_per_step": {name: round(seconds * 1e3, 3) for name, seconds in ranked[:10]},
        "steps": steps,
        "total_ms": round(total * 1e3, 3),
        "growth": None
        if growth is None
        else {
            "reference_steps": [growth.first, growth.last],
            "before_ms": round(growth.before * 1e3, 3),
            "now_ms": round(growth.now * 1e3, 3),
            "by_step": growth.seen,
        },
    }
    return Finding("slow_layers", named[0][0], steps[-1], "info", message, evidence)


def _descendants(event: Any) -> Iterator[Any]:
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _time(event: Any, cuda: bool) -> float:
    micros = event.device_time_total if cuda else event.cpu_time_total
    return micros * 1e-6


def _per_step(times: dict[str, float], steps: int) -> dict[str, float]:
    return {name: seconds / steps for name, seconds in times.items()}


def _fix(kind: str) -> str:
    return next((fix for names, fix in FIXES if any(n in kind for n in names)), DEFAULT_FIX)


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
