import pytest
import torch
from torch import nn

from hookscope.doctor import record_types, recorders, selection
from hookscope.doctor.recorders import ActivationRecorder, GradientRecorder


def test_recorders_record_exactly_the_steps_their_feeder_says_are_recorded():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    activations, gradients = ActivationRecorder(select=None), GradientRecorder(select=None, output_grads=True)
    for recorder in (activations, gradients):
        recorder.attach(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        recorded = step in (1, 4)
        for recorder in (activations, gradients):
            recorder.begin_batch(step, True, recorded)
        model(torch.randn(3, 4)).sum().backward()
        gradients.gradients_ready()
        opt.step()
        gradients.step_done()
        opt.zero_grad()
        for recorder in (activations, gradients):
            recorder.end_batch()
    assert [r.step for r in activations.history["1"]] == [1, 4]
    assert [r.step for r in gradients.history["0"]] == [1, 4]
    assert [r.step for r in gradients.param_history["0.weight"]] == [1, 4]


class SharedReLU(nn.Module):
    """super_resolution's ``Net`` in small: one ``nn.ReLU`` after convolutions of 8, 8 and 4 channels."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 4, 3)

    def forward(self, x):
        return self.relu(self.conv3(self.relu(self.conv2(self.relu(self.conv1(x))))))


def test_a_module_called_again_on_another_layout_keeps_its_first():
    """It raised "RunningStats got a tensor with 4 channels (dim 1) after tensors with 8" out of the
    training step, killing the user's run; now the 8-channel calls are recorded and the 4-channel one is
    left out, its output gradient too."""
    torch.manual_seed(0)
    model = SharedReLU()
    activations, gradients = ActivationRecorder(select=None), GradientRecorder(select=None, output_grads=True)
    for recorder in (activations, gradients):
        recorder.attach(model)
    for step in range(2):
        for recorder in (activations, gradients):
            recorder.begin_batch(step, True, True)
        model(torch.randn(2, 1, 10, 10)).sum().backward()
        gradients.gradients_ready()
        gradients.step_done()
        for recorder in (activations, gradients):
            recorder.end_batch()
    relu = activations.history["relu"]
    assert [r.step for r in relu] == [0, 1] and len(relu[0].stats.channel_rms) == 8
    assert [r.step for r in gradients.history["relu"]] == [0, 1]


def test_the_old_records_module_names_still_work_with_a_warning():
    from hookscope.doctor import records

    for name, module in (
        ("StepStats", record_types),
        ("ParamRecord", record_types),
        ("with_parameters", selection),
        ("ActivationRecorder", recorders),
    ):
        with pytest.warns(DeprecationWarning, match=f"records.{name} moved"):
            assert getattr(records, name) is getattr(module, name)
