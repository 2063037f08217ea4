"""Where the training time goes and whether memory grows: the doctor's ``input_bound``, ``step_stalls``
and ``memory_growth``. One module per concept; :class:`TimingRecorder` feeds them all."""

from hookscope.doctor.timing.recorder import TimingRecorder

__all__ = ["TimingRecorder"]
