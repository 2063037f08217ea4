"""The :class:`TimingRecorder`: where each training step's time goes, and the process's memory over time,
behind the engine's feed interface.

It is fed like the engine's other recorders — :meth:`~TimingRecorder.attach`,
:meth:`~TimingRecorder.begin_batch`, :meth:`~TimingRecorder.log_loss`,
:meth:`~TimingRecorder.gradients_ready`, :meth:`~TimingRecorder.step_done`,
:meth:`~TimingRecorder.step_cancelled` or :meth:`~TimingRecorder.discard_batch`,
:meth:`~TimingRecorder.end_batch`, :meth:`~TimingRecorder.begin_valid` /
:meth:`~TimingRecorder.end_valid`, :meth:`~TimingRecorder.close` or :meth:`~TimingRecorder.fail` — and
registers a forward pre-hook and a forward hook on the model's root (where the forward starts and ends).
Each feed call that changes the phase (see :mod:`~hookscope.doctor.timing.phases`) marks the time: a
``time.perf_counter`` on the CPU (:mod:`~.host_clock`), a pooled CUDA event on a GPU (:mod:`~.cuda_clock`).
:meth:`~TimingRecorder.flush` reads the finished steps into bounded histories (:mod:`~.history`) and judges
each new step once for stalls; :meth:`~TimingRecorder.findings` reads them every :data:`RULES_EVERY` steps and
runs the rules — ``input_bound``, ``step_stalls``, ``memory_growth``, ``page_faults`` (on the CPU, from
the process's counters read at the end of each step: :mod:`~.page_faults`), and a profile of the layers
once the steps grew slower for no other reason (:mod:`~.slowdown`) — and returns the findings not
returned before.
Memory (:mod:`~.memory`) is sampled at the end of every ``memory_every``-th step (on the CPU, less often once
a read costs more than a quarter of a percent of the time between two: see :class:`~.memory.MemoryCadence`).
The first ``warmup`` steps (compilation, allocator and loader warm-up) are kept in the run's history but
judged by no rule; so are the first ``warmup`` steps after a resume (:meth:`~TimingRecorder.load_state_dict`),
which warm up again.

Per step it costs five to six clock reads (or event records), a ``getrusage`` on the CPU and a few Python
calls; never a host sync.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from hookscope.doctor.findings import Finding
from hookscope.doctor.timing.callback_time import CallbackTime
from hookscope.doctor.timing.cpu_wait import CpuWait
from hookscope.doctor.timing.cuda_clock import CudaClock
from hookscope.doctor.timing.gc_time import GcTime
from hookscope.doctor.timing.history import Blocks, Ring
from hookscope.doctor.timing.host_clock import HostClock
from hookscope.doctor.timing.host_syncs import SyncSampler
from hookscope.doctor.timing.input_bound import input_bound
from hookscope.doctor.timing.loader_settings import LoaderSettings, usable_cores
from hookscope.doctor.timing.memory import MemoryCadence, MemoryProbe
from hookscope.doctor.timing.memory_growth import memory_growth
from hookscope.doctor.timing.page_faults import KERNEL, KernelCounters, page_faults
from hookscope.doctor.timing.phases import (
    BACKWARD,
    COLUMNS,
    DATA,
    FORWARD,
    OPTIMIZER,
    OTHER,
    PHASES,
    STEP_PHASES,
    VALID,
)
from hookscope.doctor.timing.recompiles import RecompileWatch
from hookscope.doctor.timing.slow_layers import STEPS, ProfileWindow
from hookscope.doctor.timing.slowdown import Slowdown
from hookscope.doctor.timing.stalls import EAGER_STEP, MIN_EXCESS, StallDetector, step_stalls
from hookscope.hooks.handles import HookSet, eager_forced
from hookscope.hooks.tensors import model_device

RECENT = 512  # steps kept one by one: the stalls' share of the time is counted over them
BASELINE = 256  # the recent steps a new step is judged against, and input_bound reads
RULES_EVERY = 50  # steps read between two runs of the rules (a check's cost stays small)
MEMORY_RECENT = 256  # memory samples the rule reads
HISTORY = 1000  # rows of the run's thinned history
STALLS_KEPT = 64  # the latest stalls in the run's record
MIN_CALLBACK = MIN_EXCESS / 2  # seconds: a callback call shorter than this cannot explain a stall


class TimingRecorder:
    """Phase times per optimizer step, memory every ``memory_every`` steps (None: every step on CUDA,
    every 4th on the CPU and less often while a read is slow), the first ``warmup`` steps left out of the
    rules. ``loader``: the training DataLoader, whose settings ``input_bound`` names (also
    :meth:`watch_loader`)."""

    # Its histories are bounded by their own blocks: the engine's cadence has nothing to follow here.
    thinnings = 0

    def __init__(self, warmup: int = 10, memory_every: int | None = None, loader: Any = None) -> None:
        if warmup < 0 or (memory_every is not None and memory_every < 1):
            raise ValueError(
                f"TimingRecorder: warmup={warmup}, memory_every={memory_every}; use warmup >= 0 and "
                "memory_every >= 1 (or None)"
            )
        self.warmup, self.memory_every_asked = warmup, memory_every
        self.memory_cadence = MemoryCadence(memory_every or 1, adaptive=False)
        self.loader: LoaderSettings | None = None
        self.epoch_length: int | None = None
        self.watch_loader(loader)
        self.device = torch.device("cpu")
        self.recent = Ring(RECENT, len(COLUMNS))
        self.history = Blocks(HISTORY, len(COLUMNS))
        self.memory_recent = Ring(MEMORY_RECENT, 1)
        self.kernel = Ring(RECENT, 2)  # per step on the CPU: the process's kernel seconds and page faults
        self.memory_history = Blocks(HISTORY, 1)
        self.stalls = StallDetector()
        self.callback_time = CallbackTime()
        self.memory: MemoryProbe | None = None
        self._memory_read: list[tuple[int, int]] = []  # (step, bytes) read since the last flush
        self._counters: KernelCounters | None = None  # on the CPU, where the system counts them
        self._counted: list[tuple[int, float, int]] = []  # (step, kernel seconds, faults) since the flush
        self.steps_read = 0  # steps whose times reached the host
        self._ruled_at: int | None = None  # steps_read when the rules last ran
        self._closed = False
        self._clock: HostClock | CudaClock = HostClock()
        self._gc = GcTime()
        self._wait = CpuWait()
        self._hooks = HookSet()
        self._phase = DATA
        self._callbacks_in_data = 0.0  # the callbacks' own time inside this step's data phase
        self._step = 0
        self._judged_from: int | None = warmup  # None after a resume: the next training step sets it
        self._forward_seen = False  # the root forward's hooks fire: they, not begin_batch, start it
        self._notes: dict[int, tuple[str, ...]] = {}  # per step: what the loop noted in it
        self._open_notes: tuple[str, ...] = ()  # noted in the step not closed yet
        self._slowest: dict[int, tuple[str, float]] = {}  # per step: its slowest callback event
        self._reported: set[str] = set()
        self.recompiles = RecompileWatch(lambda: self._step, self.note)  # torch.compile's recompilations
        self.host_syncs = SyncSampler(warmup)  # CUDA: the syncs of a few sampled steps
        self.slow_layers = ProfileWindow(self.note)  # on request: the modules' share of the time
        self.slowdown = Slowdown()  # steps slower than at the run's start: profiled once by themselves
        self.compiled = False  # the loop runs the model through torch.compile (its caller says so)

    # ---- feed ----------------------------------------------------------------------------------------

    def attach(self, model: nn.Module, loader: Any = None) -> None:
        """Hook the root of ``model``; its device picks the clock and the memory counter."""
        self._hooks.remove()
        if loader is not None:
            self.watch_loader(loader)
        self.device = model_device(model)
        self._clock = CudaClock(self.device) if self.device.type == "cuda" else HostClock()
        if self.memory is not None:
            self.memory.close()
        self.memory = MemoryProbe(self.device)
        every = self.memory_every_asked or (1 if self.device.type == "cuda" else 4)
        self.memory_cadence = MemoryCadence(every, self.memory_every_asked is None, self.warmup)
        self._hooks.forward_pre(model, self._forward_starts)
        self._hooks.forward(model, self._forward_ends)
        cpu = self.device.type == "cpu" and KernelCounters.available()
        self._counters = KernelCounters() if cpu else None
        self._gc.start()
        self._gc.take()
        self._wait.choose()
        self.recompiles.start()
        self.host_syncs.active = self.device.type == "cuda"
        self.slow_layers.attach(model, self.device.type == "cuda")
        self._wait.take()
        self._phase, self._closed = DATA, False

    def watch_loader(self, loader: Any) -> None:
        """The training DataLoader: ``input_bound`` names its settings, ``step_stalls`` its epoch length."""
        if loader is None:
            return
        self.loader = LoaderSettings.of(loader)
        try:
            self.epoch_length = len(loader)
        except TypeError:
            self.epoch_length = None

    def profile_layers(self, steps: int = STEPS) -> None:
        """``slow_layers``: profile ``steps`` training steps once the warm-up is over (from the next step
        when it is), then name the modules that take most of the forward and backward time."""
        self.slow_layers.request(max(self.warmup, self._step), steps)

    def note(self, event: str) -> None:
        """Something named ``event`` runs now (a checkpoint save): the step whose time holds it — the
        one that ends next — names it if it stalls."""
        self._open_notes = (*self._open_notes, event)

    def begin_batch(self, step: int, training: bool, recorded: bool = True) -> None:
        """A batch starts. Where the root forward's hooks do not fire, a training batch's forward starts
        here; ``recorded`` does not matter (every step is timed)."""
        if not training:
            return
        self._step = step
        if self._judged_from is None:  # the first step after a resume warms up again
            self._judged_from = step + self.warmup
            self.memory_cadence.restart(step, self._judged_from)
        if not self._forward_seen and self._phase == DATA:
            self._switch(FORWARD)
        if self.host_syncs.active:  # CUDA only
            self.host_syncs.begin(step)
        if self.slow_layers.start is not None:  # a profile was asked for
            self.slow_layers.begin_batch(step)

    def log_loss(self, loss: torch.Tensor, training: bool) -> None:
        """The loss ends the forward when the root forward's end was not seen."""
        if training and self._phase == FORWARD:
            self._switch(BACKWARD)

    def gradients_ready(self) -> None:
        self._switch(OPTIMIZER)

    def step_done(self) -> None:
        self._switch(OTHER)

    def step_cancelled(self) -> None:
        self._switch(OTHER)

    def discard_batch(self) -> None:
        """The step did not happen: its time goes on into the next one (the loop spent it)."""
        self._switch(DATA)

    def end_batch(self) -> None:
        """The training step ends: close its row; sample memory when its cadence says."""
        self._switch(DATA)
        if self.host_syncs.active:
            self.host_syncs.end()
        if self.slow_layers.start is not None:
            self.slow_layers.end_batch()
        self._clock.close(self._step, self._gc.take(), self._wait.take(), self._callbacks_in_data)
        if self._counters is not None:
            self._counted.append((self._step, *self._counters.take()))
        self._callbacks_in_data = 0.0
        if self._open_notes:
            self._notes[self._step], self._open_notes = self._open_notes, ()
        slowest = self.callback_time.take()
        if slowest is not None and slowest[1] >= MIN_CALLBACK:
            self._slowest[self._step] = slowest
        if self.memory is not None and self.memory_cadence.due(self._step):
            started = time.perf_counter()
            used = self.memory.read()
            self.memory_cadence.read(self._step, started, time.perf_counter())
            self._memory_read.append((self._step, used))  # into the histories at the next flush

    def begin_valid(self) -> None:
        self._switch(VALID)

    def end_valid(self, step: int) -> None:
        self._switch(DATA)
        if self._counters is not None:  # the validation's faults belong to no step
            self._counters.restart()
        self.callback_time.take()  # validation's callbacks belong to no step

    def leave_out(self) -> None:
        """The time since the last step ended (the doctor's own check, run between two steps) belongs to
        no step."""
        if self._phase == DATA:
            self._restart()

    def close(self) -> None:
        """Remove the hooks and the collector's callback; every step timed is read at the next flush."""
        self._detach()
        self._closed = True
        self.flush(wait=True)

    def fail(self) -> None:
        self._detach()

    def _detach(self) -> None:
        """Remove the hooks, the collector's callback and the watches; close the open files."""
        self._hooks.remove()
        self._gc.stop()
        self.recompiles.stop()
        self.host_syncs.end()
        self.slow_layers.close()
        self._wait.close()
        if self.memory is not None:
            self.memory.close()

    # ---- checking ------------------------------------------------------------------------------------

    def flush(self, wait: bool = False) -> None:
        """The rows of the steps finished since the last read, and the memory read since, into the
        histories; each new step judged for stalls. On CUDA, steps the device has not finished wait for
        the next read (``wait``: for all of them)."""
        memory, self._memory_read = self._memory_read, []
        for step, used in memory:
            self._take_memory(step, used)
        counted, self._counted = self._counted, []
        for step, *row in counted:
            if self._judged(step):
                self.kernel.add(step, row)
        rows = self._clock.take(wait)
        new = 0
        for step, row in rows:
            self.history.add(step, row)
            self.steps_read += 1
            if self._judged(step):
                self.recent.add(step, row)
                new += 1
        if new:
            steps, table = self.recent.view(BASELINE)
            self.stalls.judge(
                steps, table, min(new, len(steps)), self._notes, self._slowest, self._wait.parallel
            )
            oldest = int(steps[0])
            self._notes = {s: n for s, n in self._notes.items() if s >= oldest}
            self._slowest = {s: c for s, c in self._slowest.items() if s >= oldest}

    def findings(self, data_is_waiting: bool = True) -> list[Finding]:
        """Once :data:`RULES_EVERY` steps were closed since the rules last ran (and after :meth:`close`):
        read what is pending, run the rules and return the findings not returned before; else nothing
        (the steps wait: reading them costs a check more than the rules). ``data_is_waiting=False``: the
        time between two steps holds other training (a GAN's other player steps there), so
        ``input_bound`` cannot tell the loader's share and stays silent."""
        closed = self.steps_read + self._clock.waiting
        if self._ruled_at is not None and closed - self._ruled_at < RULES_EVERY and not self._closed:
            return []
        self.flush()
        self._ruled_at = self.steps_read
        if not self._closed:  # the threads that compute the steps now (the intra-op pool may change)
            self._wait.choose()
        steps, rows = self.recent.view()
        counters = self._counters_of(steps)
        kernel = counters[:, KERNEL] if counters is not None else None
        growth = self.slowdown.check(steps, rows, self._wait.parallel, kernel)
        if growth is not None and self.slow_layers.start is None and not self._closed:
            self.slow_layers.request(self._step + 1, STEPS, growth)
        found = [
            input_bound(
                steps[-BASELINE:], rows[-BASELINE:], self.loader, usable_cores(), self.device.type == "cuda"
            )
            if data_is_waiting
            else None,
            step_stalls(list(self.stalls.stalls), steps, rows, self.epoch_length),
            self._memory_finding(),
            self._page_faults_finding(steps[-BASELINE:], rows[-BASELINE:], counters),
            self.recompiles.finding(self.warmup),
            self.host_syncs.finding(),
            self._slow_layers_finding(steps, rows, kernel),
        ]
        new = [f for f in found if f is not None and f.kind not in self._reported]
        self._reported.update(f.kind for f in new)
        return new

    @property
    def breakdown(self) -> dict[str, float]:
        """Mean seconds per step in each column over the recent steps (the Performance section)."""
        _, rows = self.recent.view()
        means = rows.mean(axis=0) if len(rows) else np.zeros(len(COLUMNS))
        return dict(zip(COLUMNS, (float(v) for v in means), strict=True))

    def record(self) -> dict[str, Any]:
        """The run's timing as plain numbers (``timing.json``, the report's Performance section, the
        trackers): the mean breakdown, the whole run in blocks of steps, the recent step times, memory
        over the run and the stalls (steps timed so far: read at the doctor's checks)."""
        steps, rows = self.recent.view()
        memory = self.memory
        return {
            "columns": list(COLUMNS),
            "step_phases": list(PHASES),
            "steps_timed": self.steps_read,
            "breakdown_s": {k: _us(v) for k, v in self.breakdown.items()},
            "run": {
                "first_steps": list(self.history.first_steps),
                "stride": self.history.stride,
                "seconds": [[_us(v) for v in row] for row in self.history.means],
            },
            "recent": {
                "steps": steps.tolist(),
                "step_s": [_us(v) for v in rows[:, :STEP_PHASES].sum(axis=1)],
            },
            "memory": {
                "what": memory.what if memory is not None else None,
                "total_bytes": memory.total if memory is not None else None,
                "first_steps": list(self.memory_history.first_steps),
                "bytes": [float(row[0]) for row in self.memory_history.means],
            },
            "stalls": [
                {
                    "step": s.step,
                    "seconds": _us(s.seconds),
                    "usual": _us(s.usual),
                    "phase": PHASES[s.phase],
                    "notes": list(s.notes),
                }
                for s in list(self.stalls.stalls)[-STALLS_KEPT:]
            ],
        }

    def scalars_since(self, after: int | None, spacing: int) -> list[tuple[int, dict[str, float]]]:
        """``time/<phase>`` and ``time/step`` seconds of the recent steps after step ``after``, each at
        least ``spacing`` after the one before (what a tracker logs at each read)."""
        chosen = []
        for step, row in zip(*self.recent.view(), strict=True):
            if after is None or step >= after + spacing:
                values = {f"time/{phase}": float(row[i]) for i, phase in enumerate(PHASES)}
                chosen.append((int(step), {**values, "time/step": float(row[:STEP_PHASES].sum())}))
                after = int(step)
        return chosen

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The histories, the stalls and what was reported (the finished steps read first)."""
        self.flush(wait=True)
        return {
            "reported": sorted(self._reported),
            "steps_read": self.steps_read,
            "recent": self.recent.state_dict(),
            "history": self.history.state_dict(),
            "memory_recent": self.memory_recent.state_dict(),
            "memory_history": self.memory_history.state_dict(),
            "kernel": self.kernel.state_dict(),
            "stalls": self.stalls.state_dict(),
            "recompiles": self.recompiles.state_dict(),
            "slowdown": self.slowdown.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reported = set(state["reported"])
        self.steps_read = int(state["steps_read"])
        self.recent.load_state_dict(state["recent"])
        self.history.load_state_dict(state["history"])
        self.memory_recent.load_state_dict(state["memory_recent"])
        self.memory_history.load_state_dict(state["memory_history"])
        self._memory_read, self._counted = [], []
        if "kernel" in state:  # older checkpoints have none
            self.kernel.load_state_dict(state["kernel"])
        self.stalls.load_state_dict(state["stalls"])
        self.recompiles.load_state_dict(state["recompiles"])
        self.slowdown.load_state_dict(state.get("slowdown", {}))  # older checkpoints have none
        self._restart()  # the time before the resume belongs to no step
        self._phase = DATA
        self._judged_from = None

    def _judged(self, step: int) -> bool:
        """Whether the rules read ``step``: not in the warm-up at the start of the run or after a resume
        (a new process compiles, allocates and starts its loader again)."""
        return self._judged_from is not None and step >= self._judged_from

    # ---- machinery -----------------------------------------------------------------------------------

    def _switch(self, phase: int) -> None:
        if phase == self._phase:
            return
        self._clock.mark(self._phase)
        if self._phase == DATA:  # the callbacks that ran while the loop waited were not the loader
            self._callbacks_in_data += self.callback_time.counted
        if phase == DATA:
            self.callback_time.count_from_now()
        self._phase = phase

    def _restart(self) -> None:
        """The time since the last mark belongs to no step."""
        self._clock.restart()
        self._gc.take()
        self._wait.take()
        if self._counters is not None:
            self._counters.restart()
        self.callback_time.count_from_now()
        self._callbacks_in_data = 0.0

    def _forward_starts(self, model: nn.Module, args: tuple) -> None:
        if model.training and torch.is_grad_enabled():
            self._forward_seen = True
            # only a compiled model is slower eager; any model runs hooked while the doctor records
            if self.compiled and eager_forced() and EAGER_STEP not in self._open_notes:
                self.note(EAGER_STEP)
            if self._phase in (DATA, VALID, BACKWARD):
                self._switch(FORWARD)
        elif self._phase == DATA:
            self._switch(VALID)  # a loop that evaluates between steps without saying so

    def _forward_ends(self, model: nn.Module, args: tuple, output: Any) -> None:
        if self._phase == FORWARD and model.training and torch.is_grad_enabled():
            self._switch(BACKWARD)

    def _take_memory(self, step: int, used: int) -> None:
        row = np.array([float(used)])
        self.memory_history.add(step, row)
        if self._judged(step):
            self.memory_recent.add(step, row)

    def _counters_of(self, steps: np.ndarray) -> np.ndarray | None:
        """The kernel counters of the recent ``steps`` (rows of :data:`~.page_faults.KERNEL` seconds and
        faults); None where they were not counted (a GPU, Windows) for all of them."""
        counted, rows = self.kernel.view()
        n = len(steps)
        if n == 0 or len(counted) < n or not np.array_equal(counted[-n:], steps):
            return None
        return rows[-n:]

    def _slow_layers_finding(
        self, steps: np.ndarray, rows: np.ndarray, kernel: np.ndarray | None
    ) -> Finding | None:
        """The profiled window's finding. A window the slowdown opened reports only when its steps, and the
        steps after it, were still slow; one that was fast again is dropped (the growth stays found, once)."""
        window = self.slow_layers
        if window.growth is None or not window.times:  # asked for, not read yet, or dropped
            return window.finding()
        held = self.slowdown.holds(steps, rows, window.profiled, kernel)
        if held is False:
            window.dismiss()
        return window.finding() if held else None

    def _page_faults_finding(
        self, steps: np.ndarray, rows: np.ndarray, counters: np.ndarray | None
    ) -> Finding | None:
        if counters is None:
            return None
        counters = counters[-len(steps) :]
        memory_steps, memory = self.memory_recent.view()
        return page_faults(steps, rows, counters, memory_steps, memory[:, 0])

    def _memory_finding(self) -> Finding | None:
        if self.memory is None:
            return None
        steps, values = self.memory_recent.view()
        return memory_growth(steps, values[:, 0], self.memory.what, self.memory.where, self.memory.total)


def _us(seconds: float) -> float:
    """Seconds to the microsecond (the record stays small)."""
    return round(float(seconds), 6)
