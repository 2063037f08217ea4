"""torch's random state, captured and restored in one place."""

import torch
from torch import nn

from hookscope.hooks.rng import restore_torch_rng, torch_rng


def test_restoring_a_capture_draws_the_same_numbers_again() -> None:
    torch.manual_seed(3)
    torch.rand(5)  # somewhere in the stream, not at a seed
    state = torch_rng()
    first = torch.rand(8)
    mask = nn.functional.dropout(torch.ones(16), 0.5)
    restore_torch_rng(state)
    assert torch.equal(torch.rand(8), first)
    assert torch.equal(nn.functional.dropout(torch.ones(16), 0.5), mask)


def test_a_capture_is_a_copy_that_later_draws_leave_alone() -> None:
    state = torch_rng()
    kept = state.cpu.clone()
    torch.rand(100)
    assert torch.equal(state.cpu, kept)
    assert (state.cuda is None) == (not torch.cuda.is_initialized())
