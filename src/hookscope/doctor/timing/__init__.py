"""Where the training time goes and whether memory grows: the doctor's ``input_bound``, ``step_stalls``,
``memory_growth`` and ``page_faults``. One module per concept; :class:`TimingRecorder` feeds them all.
:func:`keep_freed_memory` is the fix ``page_faults`` names, for a process already running."""

from hookscope.doctor.timing.page_faults import keep_freed_memory
from hookscope.doctor.timing.recorder import TimingRecorder

__all__ = ["TimingRecorder", "keep_freed_memory"]
