"""One reading of a batch for the whole package: inputs and targets, positional and keyword arguments."""

import torch

from hookscope.hooks.ablate import split_batches
from hookscope.hooks.batch import split_batch, split_inputs
from hookscope.train.learner import split_batch as learner_split_batch


def test_the_last_item_of_a_tuple_or_list_batch_is_the_target() -> None:
    x1, x2, y = torch.zeros(2, 3), torch.ones(2, 1), torch.tensor([0, 1])
    inputs, targets = split_batch((x1, x2, y))
    assert inputs[0] is x1 and inputs[1] is x2 and len(inputs) == 2
    assert len(targets) == 1 and targets[0] is y
    inputs, targets = split_batch([x1, y])
    assert type(inputs) is tuple and type(targets) is tuple  # a list batch gives tuples too
    assert inputs[0] is x1 and targets[0] is y


def test_a_lone_tensor_a_one_item_batch_and_a_dict_are_inputs_without_target() -> None:
    x = torch.arange(6.0).reshape(3, 2)  # three rows: not sliced into inputs and a target
    inputs, targets = split_batch(x)
    assert len(inputs) == 1 and inputs[0] is x and targets == ()
    inputs, targets = split_batch((x,))
    assert len(inputs) == 1 and inputs[0] is x and targets == ()
    batch = {"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([0])}
    inputs, targets = split_batch(batch)
    assert len(inputs) == 1 and inputs[0] is batch and targets == ()


def test_the_learner_and_ablate_split_as_split_batch_does() -> None:
    x, y = torch.zeros(2, 3), torch.tensor([0, 1])
    assert learner_split_batch is split_batch
    ((inputs, targets),) = split_batches([(x, y)], "test")
    assert inputs[0] is x and targets[0] is y


def test_split_inputs_gives_keyword_arguments_for_a_dict_and_positional_ones_otherwise() -> None:
    x = torch.zeros(1, 2)
    assert split_inputs({"input": x}) == ((), {"input": x})
    args, kwargs = split_inputs([x, 3])
    assert (len(args), args[0] is x, args[1], kwargs) == (2, True, 3, {})
    args, kwargs = split_inputs(x)
    assert len(args) == 1 and args[0] is x and kwargs == {}
