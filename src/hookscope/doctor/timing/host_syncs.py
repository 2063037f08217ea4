"""``host_syncs`` (CUDA): the training step stops the host until the GPU has finished everything queued —
``.item()``, ``.cpu()``, ``.tolist()``, printing a tensor, ``if tensor:``, a data-dependent shape
(``nonzero``, boolean-mask indexing) — so the device idles while Python catches up.

:class:`SyncSampler` turns torch's sync debug mode on (``torch.cuda.set_sync_debug_mode("warn")``: a
warning at each synchronizing call) for :data:`SAMPLES` training steps, one every :data:`EVERY` after the
warm-up, and off again at each one's end: nothing stays on between them. Each warning is caught with the
Python stack that made it and named by the innermost frame outside torch: the user's file and line. A
sync that hookscope makes (the doctor reads its statistics in bulk, by design) is not counted, nor the
grad scaler's read of whether the gradients were finite (``GradScaler.step``: fp16 training needs it).

:func:`host_syncs` reports when the sampled steps synchronise :data:`MIN_PER_STEP` times or more each.
"""

from __future__ import annotations

import linecache
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hookscope.doctor.findings import Finding

SYNC_WARNING = "called a synchronizing CUDA operation"  # the text of torch's warning (c10/cuda)
# torch's notice, once a process, at the first switch into the debug mode: the sampler's switch, not the
# user's, so it is not theirs to read (it reached the console of every GPU run under the Doctor)
PROTOTYPE_NOTICE = "Synchronization debug mode is a prototype feature"
SAMPLES = 3
EVERY = 20  # steps between two sampled steps
MIN_PER_STEP = 1.0
TORCH = str(Path(torch.__file__).parent)
HOOKSCOPE = str(Path(__file__).parents[2])
WARNINGS = str(Path(warnings.__file__))
GRAD_SCALER = str(Path(TORCH, "amp", "grad_scaler.py"))  # reads found_inf once a step, by design

Site = tuple[str, int]  # (file, line)


class SyncSampler:
    """Counts the synchronising calls of a few sampled training steps by the line that made them.
    ``set_mode``/``get_mode``: torch's sync debug mode (a CPU twin in tests)."""

    def __init__(
        self,
        warmup: int,
        set_mode: Callable[[Any], None] = torch.cuda.set_sync_debug_mode,
        get_mode: Callable[[], int] = torch.cuda.get_sync_debug_mode,
    ) -> None:
        self.warmup = warmup
        self.active = False  # on a CUDA device only (attach says)
        self.samples: dict[int, Counter[Site]] = {}  # sampled step -> syncs per site
        self._set_mode, self._get_mode = set_mode, get_mode
        self._open: tuple[int, Any, Any] | None = None  # (step, previous mode, the warnings' state)

    def sampled(self, step: int) -> bool:
        """Whether ``step`` is one of the sampled ones."""
        since = step - self.warmup
        return since >= 0 and since % EVERY == 0 and since // EVERY < SAMPLES

    def begin(self, step: int) -> None:
        """A training step starts: catch its syncs when it is sampled."""
        if not self.active or self._open is not None or not self.sampled(step) or step in self.samples:
            return
        catcher = warnings.catch_warnings()
        catcher.__enter__()
        warnings.filterwarnings("always", message=SYNC_WARNING)
        warnings.filterwarnings("ignore", message=PROTOTYPE_NOTICE)
        shown = warnings.showwarning
        warnings.showwarning = lambda message, *args, **kw: self._shown(message, shown, args, kw)
        self.samples[step] = Counter()
        self._open = (step, self._get_mode(), catcher)
        self._set_mode("warn")

    def end(self) -> None:
        """The step ends: the debug mode and the warnings as they were."""
        if self._open is None:
            return
        _, mode, catcher = self._open
        self._open = None
        self._set_mode(mode)
        catcher.__exit__(None, None, None)

    def record(self, stack: list[traceback.FrameSummary]) -> None:
        """One sync made by ``stack`` (outermost frame first) in the open step. Left out: hookscope's own,
        and the grad scaler's check of its gradients (the price of fp16 training, once a step)."""
        if self._open is None or any(f.filename == GRAD_SCALER for f in stack):
            return
        frame = _caller(stack)
        if frame is not None and not frame.filename.startswith(HOOKSCOPE):
            self.samples[self._open[0]][(frame.filename, frame.lineno or 0)] += 1

    def finding(self) -> Finding | None:
        """:func:`host_syncs` over the steps sampled so far."""
        return host_syncs(self.samples)

    def _shown(self, message: Any, shown: Callable[..., None], args: tuple, kw: dict) -> None:
        if SYNC_WARNING in str(message):
            self.record(traceback.extract_stack()[:-2])  # without this method and the lambda
        else:
            shown(message, *args, **kw)


def host_syncs(samples: dict[int, Counter[Site]], min_per_step: float = MIN_PER_STEP) -> Finding | None:
    """The finding when the sampled steps synchronise ``min_per_step`` times or more each, on average."""
    if not samples:
        return None
    steps = sorted(samples)
    counts = [sum(samples[s].values()) for s in steps]
    per_step = sum(counts) / len(steps)
    if per_step < min_per_step:
        return None
    sites = sum((samples[s] for s in steps), Counter()).most_common()
    named = "; ".join(f"{_where(site)}{_code(site)} ({n / len(steps):g} per step)" for site, n in sites[:5])
    message = (
        f"the training step makes the host wait for the GPU {per_step:g} times (sampled step"
        f"{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}): each device-to-host read (.item(), "
        ".cpu(), .tolist(), printing a tensor, `if tensor:`, a data-dependent shape such as nonzero or "
        f"boolean-mask indexing) stops Python until all queued GPU work is done. Where: {named}. The usual "
        "fix: keep values on the device and read them every few steps (sum the loss in a tensor), move "
        "tensors with .to('cpu', non_blocking=True) from pinned memory, avoid data-dependent shapes."
    )
    evidence = {
        "per_step": round(per_step, 3),
        "steps": steps,
        "counts": counts,
        "sites": {_where(site): n / len(steps) for site, n in sites[:10]},
    }
    return Finding("host_syncs", "", steps[-1], "warning", message, evidence)


def _caller(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame outside torch and the warnings module: the line that asked for the sync."""
    for frame in reversed(stack):
        if not frame.filename.startswith(TORCH) and frame.filename != WARNINGS:
            return frame
    return None


def _where(site: Site) -> str:
    return f"{site[0]}:{site[1]}"


def _code(site: Site) -> str:
    line = linecache.getline(*site).strip()
    return f" `{line}`" if line else ""
