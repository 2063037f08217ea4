"""The rules of the loop's protocol: what the program around the model does wrong (``zero_grad``, train
and eval modes, the batches fed, graphs kept alive, the learning-rate schedule). One module per family;
:class:`ProtocolRecorder` feeds them all."""

from hookscope.doctor.protocol.batches import loader_not_shuffled
from hookscope.doctor.protocol.recorder import ProtocolRecorder

__all__ = ["ProtocolRecorder", "loader_not_shuffled"]
