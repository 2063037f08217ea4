"""``step_stalls``: single steps far slower than the others, periodic or not, and who was running.

:class:`StallDetector` looks at every step once, as its row is read: a step is a stall when its time of
its own — its time less the time the training's threads waited for a core (:mod:`~.cpu_wait`: another
process had it) — is above the recent steps' median by more than :data:`MADS` robust deviations (1.4826
x the median absolute deviation), at least :data:`FACTOR` times the median and at least
:data:`MIN_EXCESS` longer (the baseline is computed again every :data:`REBASE` steps). When
several threads compute the steps (an intra-op pool), no step is judged while the usual step waits for
a core :data:`BUSY` of its time or more: the wait read is each thread's own, and the threads of one
parallel region wait in turn (spinning while the others wait), so on a machine that busy it no longer
tells the machine's part of a slow step (one thread's wait does). Each stall
keeps what was running: the phase where its extra time went, the garbage collector's seconds in it
(``gc.callbacks``), the events the loop noted in it (``note("checkpoint save")``) and the callback event
that took half its extra time or more (``callback Logger.after_batch``).

:func:`step_stalls` reports them when they are periodic — :data:`MIN_PERIODIC` or more stalls, most gaps
between them equal (read among the stalls that carry the time: a busy machine's far shorter hiccup
between two does not split their gap) — and take at least :data:`PERIODIC_SHARE` of the time, or, not
periodic, when :data:`MIN_STALLS` or more take at least :data:`SHARE` of the time (counted over the
recent steps). Only isolated stalls count: consecutive slow steps alike are a busy machine slowing the
run down for a while (the cores taken by another process), and a busy machine's odd slow step stays
below both bars; a stall beside a much shorter one (a hiccup of the machine next to a save) still counts.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookscope.doctor.findings import Finding
from hookscope.doctor.timing.phases import DATA, GC, PHASES, STEP_PHASES, WAIT

MADS = 6.0
FACTOR = 2.0
MIN_EXCESS = 25e-3  # seconds: a busy machine preempts a process for a few ms at a time
BUSY = 0.2  # the usual step's share of time waiting for a core above which no stall is judged
MIN_BASELINE = 16  # steps before the first judgement
MIN_STALLS = 5
SHARE = 0.1
MIN_PERIODIC = 4
PERIODIC_SHARE = 0.02
KEPT = 512
NEIGHBOUR = 0.5  # of a stall's extra time: a neighbouring stall that long makes both a slow spell
MINOR = 0.25  # of the stalls' median extra time: a stall that short is a hiccup, not on the period's beat
REBASE = 32  # new steps judged against one baseline before it is computed again
CALLBACK = "callback "  # how a note names a callback event that took a stall's time


@dataclass(frozen=True)
class Stall:
    """One slow step: its time, the usual time then, where the extra time went, the collector's time
    in it and what the loop noted in it."""

    step: int
    seconds: float
    usual: float
    phase: int
    gc_seconds: float
    notes: tuple[str, ...]


class StallDetector:
    """Judges each new step against the recent ones; keeps the last :data:`KEPT` stalls."""

    def __init__(self) -> None:
        self.stalls: deque[Stall] = deque(maxlen=KEPT)
        self.count = 0
        self._baseline: tuple[float, float, np.ndarray] | None = None  # usual, limit, typical phases
        self._judged = 0  # steps judged against it

    def judge(
        self,
        steps: np.ndarray,
        rows: np.ndarray,
        new: int,
        notes: dict[int, tuple[str, ...]],
        slowest: dict[int, tuple[str, float]] | None = None,
        parallel: bool = False,
    ) -> None:
        """The last ``new`` of the recent ``steps``/``rows`` are read for the first time; ``notes``: what
        the loop noted per step, ``slowest``: each step's slowest callback event and its seconds;
        ``parallel``: other threads computed with the training thread."""
        if len(steps) < MIN_BASELINE or new == 0:
            return
        totals = rows[:, :STEP_PHASES].sum(axis=1)
        own = np.maximum(totals - rows[:, WAIT], 0.0)  # less the time the machine kept the cores
        if self._baseline is None or self._judged >= REBASE:
            self._baseline, self._judged = _baseline(totals, own, rows), 0
        usual, limit, typical = self._baseline
        self._judged += new
        if parallel and machine_busy(rows):
            return  # see the module's docstring
        for i in range(len(steps) - new, len(steps)):
            if own[i] <= limit:
                continue
            step = int(steps[i])
            phase = int(np.argmax(rows[i, :STEP_PHASES] - typical))
            noted = notes.get(step, ())
            callback = (slowest or {}).get(step)
            if callback is not None and callback[1] >= 0.5 * (totals[i] - usual):
                noted = (*noted, f"{CALLBACK}{callback[0]}")
            self.stalls.append(Stall(step, float(totals[i]), usual, phase, float(rows[i, GC]), noted))
            self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "stalls": [list(s.__dict__.values()) for s in self.stalls]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        self.stalls = deque(
            (
                Stall(int(s), float(t), float(u), int(p), float(g), tuple(n))
                for s, t, u, p, g, n in state["stalls"]
            ),
            maxlen=KEPT,
        )


def machine_busy(rows: np.ndarray) -> bool:
    """Whether the usual step of ``rows`` waited for a core :data:`BUSY` of its time or more."""
    totals = rows[:, :STEP_PHASES].sum(axis=1)
    return float(np.median(rows[:, WAIT] / np.maximum(totals, 1e-12))) >= BUSY


def _baseline(totals: np.ndarray, own: np.ndarray, rows: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The usual step time, the time of its own (less the wait for a core) above which a step stalled,
    and each phase's usual time."""
    mine = float(np.median(own))
    spread = 1.4826 * float(np.median(np.abs(own - mine)))
    limit = max(mine + MADS * spread, FACTOR * mine, mine + MIN_EXCESS)
    return float(np.median(totals)), limit, np.median(rows[:, :STEP_PHASES], axis=0)


def period(steps: list[int]) -> int | None:
    """The gap most gaps between ``steps`` share (within one step), when three quarters of the stalls lie
    on its beat, one gap apart: a slow step the machine caused between two periodic stalls splits a gap
    but leaves the beat."""
    if len(steps) < MIN_PERIODIC:
        return None
    common, _ = Counter(np.diff(steps).tolist()).most_common(1)[0]
    if common < 2:
        return None
    phases = np.asarray(steps) % common
    beat = Counter(phases.tolist()).most_common(1)[0][0]
    off = np.abs((phases - beat + 1) % common - 1)  # distance to the beat, wrapping round the period
    on = np.asarray(steps)[off <= 1]
    gaps = np.diff(on)
    regular = int(np.sum(np.abs(gaps - common) <= 1))
    enough = len(on) >= MIN_PERIODIC and len(on) >= 0.75 * len(steps)
    return int(common) if enough and regular >= 0.75 * len(gaps) else None


def isolated(stalls: list[Stall]) -> list[Stall]:
    """The stalls that stand out from their neighbouring steps: a run of slow steps alike is the machine
    slowing down for a while (another process taking the cores), not something the loop does. A stall
    whose neighbour stalled by less than :data:`NEIGHBOUR` of its extra time stays: a 0.3 s save beside
    a 30 ms hiccup of the machine is still the save."""
    extra = {s.step: s.seconds - s.usual for s in stalls}
    return [
        s
        for s in stalls
        if all(extra.get(near, 0.0) < NEIGHBOUR * extra[s.step] for near in (s.step - 1, s.step + 1))
    ]


def carrying(stalls: list[Stall]) -> list[int]:
    """The steps of the stalls that carry the time, where a period is read: a hiccup of a busy machine
    far shorter than the usual stall (under :data:`MINOR` of the stalls' median extra time) would split
    the gaps between two periodic stalls. When the hiccups are most stalls, the median is theirs and
    every stall is kept."""
    extras = [s.seconds - s.usual for s in stalls]
    floor = MINOR * float(np.median(extras))
    return [s.step for s, extra in zip(stalls, extras, strict=True) if extra >= floor]


CHECKPOINT_SAVE = "checkpoint save"  # the note a Checkpoint callback leaves on the step it saves in
SAVES_SHARE = 0.75  # of the stalls' extra time, in checkpoint saves: the stalls are the saves' price (info)
EAGER_STEP = "a recorded step, run eagerly"  # a compiled model's step the doctor records: its own cost


def step_stalls(
    stalls: list[Stall], steps: np.ndarray, rows: np.ndarray, epoch_length: int | None
) -> Finding | None:
    """The finding when the stalls among the recent ``steps`` are periodic or take much of the time."""
    if not len(steps):
        return None
    # a compiled model runs eagerly on the steps the doctor records (hooks see the eager model): that is
    # the doctor's own cost, said in docs/performance.md, not a stall of the user's loop
    recent = isolated([s for s in stalls if s.step >= steps[0] and EAGER_STEP not in s.notes])
    if len(recent) < min(MIN_PERIODIC, MIN_STALLS):
        return None
    total_time = float(rows[:, :STEP_PHASES].sum())
    extra = sum(s.seconds - s.usual for s in recent)
    share = extra / max(total_time, 1e-12)
    beats = carrying(recent)
    every = period(beats)
    periodic = every is not None and len(recent) >= MIN_PERIODIC and share >= PERIODIC_SHARE
    if not periodic and (len(recent) < MIN_STALLS or share < SHARE):
        return None
    # stalls whose extra time is mostly the run's own checkpoint saves are the price of a choice the user
    # made: a fact worth knowing (info), not a fault; a stray slow step among them (a busy machine) does
    # not make them one
    saved = sum(s.seconds - s.usual for s in recent if CHECKPOINT_SAVE in s.notes)
    return Finding(
        "step_stalls",
        "",
        recent[-1].step,
        "info" if saved >= SAVES_SHARE * extra else "warning",
        _message(recent, share, every, len(recent) - len(beats), epoch_length, len(steps)),
        _evidence(recent, share, every),
    )


def _message(
    recent: list[Stall],
    share: float,
    every: int | None,
    off_beat: int,
    epoch_length: int | None,
    seen: int,
) -> str:
    """The finding's words; ``off_beat`` stalls fall between the beats of the period ``every``."""
    n = len(recent)
    seconds = float(np.median([s.seconds for s in recent]))
    usual = float(np.median([s.usual for s in recent]))
    when = f"every {every} steps" if every else "at irregular steps"
    listed = ", ".join(str(s.step) for s in recent[:6]) + (", ..." if n > 6 else "")
    text = (
        f"{n} of the last {seen} steps stalled, {when} (steps {listed}): {_ms(seconds)} instead of the "
        f"usual {_ms(usual)}, {share:.0%} of the time. "
    )
    if every and off_beat:
        text += f"{off_beat} of them, far shorter, fall between the beats: a busy machine's hiccups. "
    phase = Counter(s.phase for s in recent).most_common(1)[0][0]
    text += f"The extra time went to {_PHASE_WORDS[PHASES[phase]]}. "
    running, fix = _who(recent, phase, every, epoch_length)
    return text + running + fix


def _who(recent: list[Stall], phase: int, every: int | None, epoch_length: int | None) -> tuple[str, str]:
    """What was running in the stalls, and the usual fix for it."""
    n = len(recent)
    with_gc = sum(1 for s in recent if s.gc_seconds >= 0.5 * (s.seconds - s.usual))
    noted = Counter(name for s in recent for name in set(s.notes))
    said = Counter({name: k for name, k in noted.items() if not name.startswith(CALLBACK)}) or noted
    if said:  # what the loop said it ran comes before the callback that ran it
        name, count = said.most_common(1)[0]
        if name.startswith(CALLBACK):
            return _slow_callback(name.removeprefix(CALLBACK), count, n)
        return (
            f"A {name} ran in {count} of the {n} stalls. ",
            f"The usual fix: run the {name} less often, or in the background (torch.distributed.checkpoint."
            "async_save for checkpoints), or to a faster disk.",
        )
    if with_gc >= n / 2:
        return (
            f"The garbage collector ran for most of the extra time in {with_gc} of the {n} stalls. ",
            "The usual fix: gc.freeze() after building the model and data (the collector then skips "
            "those objects), fewer Python objects made per step, or gc.disable() with a gc.collect() "
            "at the end of each epoch.",
        )
    if every is not None and epoch_length is not None and abs(every - epoch_length) <= 1 and phase == DATA:
        return (
            f"The period is the loader's epoch ({epoch_length} batches): each epoch starts its data "
            "pipeline again. ",
            "The usual fix: persistent_workers=True (the workers stay between epochs) and a cheaper "
            "dataset start-up (open files once).",
        )
    if every is not None:
        return (
            "Nothing the doctor sees was running then. ",
            f"The usual cause: something the loop does every {every} steps (logging that reads the device, "
            "evaluation, a checkpoint, a print of tensors); say so with note(name) around it, or profile "
            "one such step with torch.profiler.",
        )
    return (
        "Nothing the doctor sees was running then. ",
        "The usual causes: another process on the machine, swapping, a slow disk under the loader, or "
        "an occasional slow batch (a big file, a retry); profile a slow step with torch.profiler.",
    )


def _slow_callback(label: str, count: int, n: int) -> tuple[str, str]:
    return (
        f"The callback event {label} took most of the extra time in {count} of the {n} stalls. ",
        f"The usual fix: make {label} cheaper or run it every few steps (a tracker that reads the "
        "device, writes to disk or draws a figure at each call), or move its work to the end of the epoch.",
    )


def _evidence(recent: list[Stall], share: float, every: int | None) -> dict[str, Any]:
    return {
        "stalls": len(recent),
        "steps": [s.step for s in recent[:32]],
        "period": every,
        "stall_ms": round(float(np.median([s.seconds for s in recent])) * 1e3, 3),
        "usual_ms": round(float(np.median([s.usual for s in recent])) * 1e3, 3),
        "share": round(share, 4),
        "phase": PHASES[Counter(s.phase for s in recent).most_common(1)[0][0]],
        "gc_stalls": sum(1 for s in recent if s.gc_seconds >= 0.5 * (s.seconds - s.usual)),
        "notes": dict(Counter(name for s in recent for name in set(s.notes))),
    }


_PHASE_WORDS = {
    "data": "waiting for data (between two steps)",
    "forward": "the forward",
    "backward": "the loss and backward",
    "optimizer": "the optimizer step",
    "other": "the loop's own work around the step (callbacks, schedulers)",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
