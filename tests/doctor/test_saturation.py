import torch
from torch import nn

from hookscope.doctor.saturation import SaturationRecorder


def test_shares_of_recorded_training_steps_only_with_hooks_only_then():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with torch.no_grad():
        model[0].weight.fill_(10.0)  # every output of the tanh at its ends
    recorder = SaturationRecorder(margin=0.01)
    recorder.attach(model)
    hooked = []
    for step in range(4):
        recorder.begin_batch(step, True, recorded=step % 2 == 0)
        hooked.append(len(model[1]._forward_hooks))
        model(torch.ones(2, 4))
        recorder.end_batch()
    pending = recorder.take_pending()
    recorder.store(pending, [float(v) for _, _, v in pending])
    recorder.close()
    assert hooked == [1, 0, 1, 0] and recorder.kinds == {"1": "tanh"}
    assert recorder.history == {"1": [(0, 1.0), (2, 1.0)]} and len(model[1]._forward_hooks) == 0


def test_the_history_is_thinned_when_full_and_a_checkpoint_keeps_at_most_saved_records():
    recorder = SaturationRecorder(margin=0.01, history=8)
    recorder.attach(nn.Sequential(nn.Sigmoid()))
    pending = [("0", step, torch.tensor(0.5)) for step in range(100)]
    recorder.store(pending, [0.5] * 100)
    assert len(recorder.history["0"]) <= 8 and recorder.thinnings >= 1
    restored = SaturationRecorder(margin=0.01, history=8)
    restored.load_state_dict(recorder.state_dict())
    assert restored.history == recorder.history and restored.thinnings == recorder.thinnings
