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
