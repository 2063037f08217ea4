"""``recompiles``: a ``torch.compile``d model compiling again after warm-up — its shapes change, or a
guard on a Python value, a dtype or a mode fails — so steps stall for seconds while it compiles.

:class:`RecompileWatch` hears each compilation as it ends (:func:`hookscope.compat.on_compile_end`: no
cost between compilations) and keeps the recompilations — a frame's second compilation and later ones —
with the training step they happened in, telling the recorder (``note("recompilation")``, so that a
stalled step names it). At each check it joins them with dynamo's records
(:func:`hookscope.compat.compile_records`) for the guard that failed: the text ``TORCH_LOGS=recompiles``
prints, kept whether or not logging is on. Two kinds of recompilation are left out: the eval or no-grad
variant a validation loop compiles once (expected), and those of frames in hookscope's own code (not the
user's to fix).

:func:`recompiles` reports :data:`MIN_RECOMPILES` or more after the warm-up — one is what torch's
automatic dynamic shapes costs for a short last batch — or a frame that reached torch's recompile limit
and runs uncompiled since. The fix follows from the reason: a changing shape (``dynamic=True``,
``torch._dynamo.mark_dynamic``, padding to fixed sizes, ``drop_last=True``), a Python number that
changes (pass it as a tensor), a dtype or device that changes.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookscope import compat
from hookscope.doctor.findings import Finding

MIN_RECOMPILES = 2
KEPT = 256  # recompilations kept, the latest
PACKAGE = str(Path(__file__).parents[2])  # hookscope's own frames are not the user's to fix
TORCH = str(Path(torch.__file__).parent)  # torch's own functions (Sequential.forward): not named
EXPECTED = re.compile(r"grad_mode|\.training\b")  # validation's eval / no_grad variant: compiled once

SHAPE = re.compile(r"size mismatch|stride mismatch|dimensionality|rank|dim\(\)|ndim")
VALUE = re.compile(r"==|!=|<|>")

FIXES = {
    "shape": (
        "the inputs' shapes change between calls: compile with torch.compile(model, dynamic=True), mark "
        f"the changing dimension before the call ({compat.MARK_DYNAMIC}(x, 0)), or pad the inputs to "
        "a few fixed sizes (DataLoader(drop_last=True) for a short last batch)"
    ),
    "dtype": "an input's dtype, device or requires_grad changes between calls: keep it the same each call",
    "value": (
        "a Python number or flag that changes between calls is baked into the graph: pass it as a tensor "
        "(torch.tensor(value)) or keep it constant"
    ),
    "other": "run with TORCH_LOGS=recompiles to see each guard that fails",
}


@dataclass(frozen=True)
class Recompile:
    """One compilation of a frame compiled before: the training step it happened in, dynamo's
    ``compile_id`` (``"frame/n"``), the function, and the first guard that failed."""

    step: int
    compile_id: str
    function: str = ""
    reason: str = ""
    gave_up: bool = False  # the frame reached the recompile limit: it runs uncompiled from now on


class RecompileWatch:
    """Listens to dynamo's compilations between :meth:`start` and :meth:`stop`. ``step()`` says the
    training step running now; ``note(event)`` is told of each recompilation as it happens."""

    def __init__(self, step: Callable[[], int], note: Callable[[str], None]) -> None:
        self._step, self._note = step, note
        self.recompiles: deque[Recompile] = deque(maxlen=KEPT)  # the user's, expected variants left out
        self._pending: list[tuple[int, str]] = []  # (step, compile_id), not joined with a record yet
        self._known: set[str] = set()  # compile ids seen in dynamo's records: a limit is reported once
        self._noted_at: int | None = None  # the step last noted: a step with graph breaks notes once
        self._stop: Callable[[], None] | None = None

    def start(self) -> None:
        """Listen, when dynamo is loaded (otherwise nothing in this process is compiled)."""
        if self._stop is None and compat.compile_in_use():
            self._known = {str(r.compile_id) for r in compat.compile_records()}
            self._stop = compat.on_compile_end(self._compiled)

    def stop(self) -> None:
        """Stop listening, after joining what was heard."""
        if self._stop is not None:
            self.take()
            self._stop()
            self._stop = None

    def take(self) -> None:
        """Join the recompilations heard since the last call with dynamo's records of them; add the
        frames that reached the recompile limit since (dynamo gives up before its callbacks run: such a
        frame is named at the step of the check that finds it)."""
        if self._stop is None and not self._pending:
            return
        records = {str(r.compile_id): r for r in compat.compile_records() if r.is_forward is not False}
        files = {_frame(i): r.co_filename for i, r in records.items() if r.co_filename}
        for step, compile_id in self._pending:
            self._add(_recompile(step, compile_id, records.get(compile_id), files))
        self._pending = []
        for compile_id, record in records.items():
            if compile_id not in self._known and _gave_up(record):
                self._add(_recompile(self._step(), compile_id, record, files))
        self._known.update(records)

    def _add(self, found: Recompile | None) -> None:
        if found is not None:
            self.recompiles.append(found)

    def finding(self, warmup: int) -> Finding | None:
        """:func:`recompiles` over what was heard so far."""
        self.take()
        return recompiles(list(self.recompiles), warmup)

    def _compiled(self, compile_id: str) -> None:
        if _nth(compile_id) == 0:
            return
        step = self._step()
        self._pending.append((step, compile_id))
        if step != self._noted_at:
            self._noted_at = step
            self._note("recompilation")

    # ---- checkpoint state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self.take()
        return {"recompiles": [vars(r) for r in self.recompiles]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recompiles = deque((Recompile(**r) for r in state["recompiles"]), maxlen=KEPT)


def recompiles(found: list[Recompile], warmup: int, min_recompiles: int = MIN_RECOMPILES) -> Finding | None:
    """The finding when ``min_recompiles`` or more steps after the warm-up compiled again, or a frame
    reached the recompile limit. A step counts once however many frames it compiled again (a model with
    graph breaks is several frames)."""
    late = [r for r in found if r.step >= warmup]
    steps = sorted({r.step for r in late})
    gave_up = [r for r in late if r.gave_up]
    if len(steps) < min_recompiles and not gave_up:
        return None
    kinds = Counter(_kind(r.reason) for r in late)
    kind = kinds.most_common(1)[0][0]
    example = next(r for r in reversed(late) if _kind(r.reason) == kind)
    message = (
        f"the compiled model compiled again in {_count(len(steps), 'step')} after warm-up ({_steps(steps)}), "
        "each stalling while it compiles; the last guard that failed: "
        f"{_first_line(example.reason) or 'unknown (dynamo kept no record)'}"
        + (f" in {example.function}" if example.function else "")
        + ". "
    )
    if gave_up:
        message += (
            f"{gave_up[0].function or 'The model'} reached torch's recompile limit "
            f"({compat.recompile_limit()}) and runs uncompiled from now on. "
        )
    message += f"The usual fix: {FIXES[kind]}."
    evidence = {
        "recompiles": len(steps),
        "frames": len(late),
        "steps": steps[:20],
        "reasons": dict(Counter(_first_line(r.reason) for r in late).most_common(5)),
        "cause": kind,
        "recompile_limit_hit": bool(gave_up),
    }
    severity = "warning" if gave_up or len(steps) > min_recompiles else "info"
    clear = steps[min(min_recompiles, len(steps)) - 1]
    return Finding("recompiles", "", clear, severity, message, evidence)


def _recompile(step: int, compile_id: str, record: Any, files: dict[str, str]) -> Recompile | None:
    """The recompilation, or None when it is the expected validation variant or hookscope's own frame.
    ``files``: each frame's file, from its other records (the one of a frame given up names none)."""
    if record is None:
        return Recompile(step, compile_id)
    reason = _strip_id(record.recompile_reason or "")
    filename = str(record.co_filename or files.get(_frame(compile_id), ""))
    if EXPECTED.search(_first_line(reason)) or filename.startswith(PACKAGE):
        return None
    function = f"{record.co_name} ({record.co_filename}:{record.co_firstlineno})"
    if not record.co_name or str(record.co_filename).startswith(TORCH):
        function = ""  # torch.compile's wrapper, nn.Sequential: nothing the user wrote
    return Recompile(step, compile_id, function, reason, _gave_up(record))


def _gave_up(record: Any) -> bool:
    return "recompile limit" in str(record.fail_reason or "").lower()


def _kind(reason: str) -> str:
    line = _first_line(reason)
    if SHAPE.search(line):
        return "shape"
    if "mismatch" in line:
        return "dtype"
    return "value" if VALUE.search(line) else "other"


def _frame(compile_id: str) -> str:
    """The frame part of ``compile_id`` ("frame/n" -> "frame")."""
    return compile_id.rsplit("/", 1)[0]


def _nth(compile_id: str) -> int:
    """Which compilation of its frame ``compile_id`` ("frame/n", "frame/n_attempt") names; 0: the first."""
    try:
        return int(compile_id.rsplit("/", 1)[-1].split("_")[0])
    except ValueError:
        return 0


def _strip_id(reason: str) -> str:
    """dynamo prefixes the reason with the compile id whose guards failed ("0/1: ..."): not the user's."""
    return re.sub(r"^\S+/\d+: ", "", reason.strip())


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0].strip() if reason.strip() else ""


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _steps(steps: list[int]) -> str:
    shown = ("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in steps[:6])
    return shown + (f" ... {steps[-1]}" if len(steps) > 6 else "")
