"""The timing histories: the recent steps kept one by one, the run kept in blocks that halve their density
when full; both go through a checkpoint unchanged."""

import io

import numpy as np
import torch

from hookscope.doctor.timing.history import Blocks, Ring


def _through_a_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_the_ring_keeps_the_last_rows_in_order():
    ring = Ring(size=5, width=2)
    for step in range(12):
        ring.add(step, np.array([step, 2.0 * step]))
    steps, rows = ring.view()
    assert steps.tolist() == [7, 8, 9, 10, 11]
    assert rows[:, 1].tolist() == [14.0, 16.0, 18.0, 20.0, 22.0]
    again = Ring(size=5, width=2)
    again.load_state_dict(_through_a_checkpoint(ring.state_dict()))
    again.add(12, np.array([12.0, 24.0]))
    assert again.view()[0].tolist() == [8, 9, 10, 11, 12]


def test_blocks_cover_the_whole_run_in_bounded_rows():
    blocks = Blocks(size=64, width=1)
    for step in range(1000):
        blocks.add(step, np.array([float(step)]))
    assert len(blocks.means) <= 64 and blocks.stride == 16
    assert blocks.first_steps[0] == 0 and blocks.first_steps[-1] >= 1000 - 2 * blocks.stride
    assert blocks.means[0][0] == 7.5  # the mean of steps 0..15
    assert np.diff(blocks.first_steps).tolist() == [16] * (len(blocks.first_steps) - 1)
    again = Blocks(size=64, width=1)
    again.load_state_dict(_through_a_checkpoint(blocks.state_dict()))
    assert again.stride == 16 and again.first_steps == blocks.first_steps
    assert np.array_equal(np.array(again.means), np.array(blocks.means))
    for step in range(1000, 1024):  # the block open at the checkpoint is completed after it
        again.add(step, np.array([float(step)]))
        blocks.add(step, np.array([float(step)]))
    assert again.first_steps == blocks.first_steps
    assert np.array_equal(np.array(again.means), np.array(blocks.means))
