import pytest
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler, TensorDataset

import hookscope as hs
from hookscope.train.data import (
    TensorBatches,
    as_dataloaders,
    batch_to_device,
    can_batch_in_memory,
    to_device,
)


def _dataset(n=37):
    # the "index" column makes every batch's sample indices visible
    return TensorDataset(torch.arange(n), torch.randn(n, 3), torch.randint(0, 5, (n,)))


def _epochs(iterable, n=2):
    return [[tuple(t.clone() for t in batch) for batch in iterable] for _ in range(n)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize(("batch_size", "drop_last"), [(8, False), (8, True), (37, False), (50, False)])
def test_fast_batches_equal_the_dataloader_batches_and_consume_the_same_randomness(
    shuffle, with_generator, batch_size, drop_last
):
    def loader():
        generator = torch.Generator().manual_seed(5) if with_generator else None
        return DataLoader(
            _dataset(), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator
        )

    torch.manual_seed(0)
    reference_loader = loader()
    expected = _epochs(reference_loader)
    expected_next_draw = torch.rand(3)

    torch.manual_seed(0)
    fast_loader = loader()
    got = _epochs(TensorBatches(fast_loader, torch.device("cpu")))
    assert torch.equal(torch.rand(3), expected_next_draw)
    if with_generator:
        assert torch.equal(fast_loader.generator.get_state(), reference_loader.generator.get_state())

    assert len(got) == len(expected)
    for got_epoch, expected_epoch in zip(got, expected, strict=True):
        assert len(got_epoch) == len(expected_epoch) == len(fast_loader)
        for got_batch, expected_batch in zip(got_epoch, expected_epoch, strict=True):
            for g, e in zip(got_batch, expected_batch, strict=True):
                assert g.dtype == e.dtype
                assert torch.equal(g, e)


def test_random_sampler_with_replacement_is_reproduced():
    dataset = _dataset(20)
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=50)
    torch.manual_seed(2)
    expected = _epochs(DataLoader(dataset, batch_size=16, sampler=sampler), n=1)
    torch.manual_seed(2)
    got = _epochs(
        TensorBatches(DataLoader(dataset, batch_size=16, sampler=sampler), torch.device("cpu")), n=1
    )
    assert [b[0].tolist() for b in got[0]] == [b[0].tolist() for b in expected[0]]


class _Plain(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(float(i)), torch.tensor(i)


class _LoaderSubclass(DataLoader):
    """A subclass may override iteration, so it is never fast-pathed."""


@pytest.mark.parametrize(
    "loader",
    [
        DataLoader(_Plain(), batch_size=2),
        DataLoader(_dataset(), batch_size=4, num_workers=1),
        DataLoader(_dataset(), batch_size=4, collate_fn=lambda b: b),
        DataLoader(_dataset(), batch_size=None),
        DataLoader(_dataset(), batch_sampler=[[0, 1], [2, 3]]),
        _LoaderSubclass(_dataset(), batch_size=4),
    ],
    ids=[
        "not-tensor-dataset",
        "workers",
        "custom-collate",
        "no-batching",
        "custom-batch-sampler",
        "subclass",
    ],
)
def test_loaders_that_need_their_own_iteration_are_not_fast_pathed(loader):
    assert not can_batch_in_memory(loader)


def test_simple_tensor_loaders_are_fast_pathed():
    assert can_batch_in_memory(DataLoader(_dataset(), batch_size=4, shuffle=True))
    assert can_batch_in_memory(DataLoader(_dataset(), batch_size=4))


def test_dataloaders_accepts_a_pair_and_rejects_non_loaders():
    train, valid = DataLoader(_dataset(), batch_size=4), DataLoader(_dataset(), batch_size=4)
    dls = as_dataloaders((train, valid))
    assert dls.train is train and dls.valid is valid and dls.in_memory
    assert as_dataloaders([train]).valid is None
    with pytest.raises(TypeError, match="valid must be a DataLoader"):
        hs.DataLoaders(train, 3)
    with pytest.raises(TypeError, match="pair"):
        as_dataloaders(train)


def test_to_device_moves_nested_batches_and_returns_tuples():
    batch = [torch.zeros(2), {"a": torch.ones(1)}, "label"]
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved, tuple)
    assert torch.equal(moved[0], torch.zeros(2)) and torch.equal(moved[1]["a"], torch.ones(1))
    assert moved[2] == "label"


def test_to_device_keeps_the_types_of_nested_values():
    from collections import namedtuple

    Inputs = namedtuple("Inputs", ["ids", "mask"])
    batch = (Inputs(torch.zeros(2), torch.ones(2)), [torch.ones(1), "meta"], torch.zeros(1))
    moved = to_device(batch, torch.device("cpu"))
    assert type(moved) is tuple and type(moved[0]) is Inputs and moved[0].mask is batch[0].mask
    assert type(moved[1]) is list and moved[1][1] == "meta"
    assert batch_to_device(list(batch), torch.device("cpu"))[0].ids is batch[0].ids
    assert batch_to_device(torch.ones(1), torch.device("cpu"))[0].shape == (1,)


@pytest.mark.parametrize("shuffle", [False, True])
def test_changing_a_batch_in_place_leaves_the_dataset_alone(shuffle):
    dataset = _dataset(16)
    original = [t.clone() for t in dataset.tensors]
    for batch in TensorBatches(DataLoader(dataset, batch_size=4, shuffle=shuffle), torch.device("cpu")):
        for t in batch:
            t.zero_()
    for t, before in zip(dataset.tensors, original, strict=True):
        assert torch.equal(t, before)


def test_from_tensors_splits_at_random_into_train_and_valid_loaders():
    x, y = torch.arange(100).float().unsqueeze(1), torch.arange(100)
    dls = hs.DataLoaders.from_tensors(x, y, batch_size=16, valid_pct=0.2, seed=0)
    train_x, train_y = dls.train.dataset.tensors
    valid_x, valid_y = dls.valid.dataset.tensors
    assert (len(train_y), len(valid_y)) == (80, 20)
    assert sorted(torch.cat([train_y, valid_y]).tolist()) == list(range(100))  # every sample, once
    assert valid_y.tolist() != list(range(80, 100))  # a random split, not the tail
    assert torch.equal(train_x.squeeze(1).long(), train_y)  # x and y stay paired
    assert torch.equal(valid_x.squeeze(1).long(), valid_y)
    assert dls.train.batch_size == dls.valid.batch_size == 16
    assert isinstance(dls.train.sampler, RandomSampler) and isinstance(dls.valid.sampler, SequentialSampler)
    assert can_batch_in_memory(dls.train) and can_batch_in_memory(dls.valid)


def test_from_tensors_seed_fixes_the_split_and_the_order():
    x = torch.randn(50, 3)

    def first_epoch(seed):
        dls = hs.DataLoaders.from_tensors(x, batch_size=8, seed=seed)
        return torch.cat([xb for (xb,) in dls.train])

    assert torch.equal(first_epoch(1), first_epoch(1))
    assert not torch.equal(first_epoch(1), first_epoch(2))


def test_from_tensors_without_valid_or_shuffle():
    dls = hs.DataLoaders.from_tensors(torch.arange(10), valid_pct=0, shuffle=False, batch_size=4)
    assert dls.valid is None
    assert isinstance(dls.train.sampler, SequentialSampler)


@pytest.mark.parametrize(
    ("tensors", "valid_pct", "error", "message"),
    [
        ((torch.zeros(4), torch.zeros(5)), 0.2, ValueError, r"hold \[4, 5\] samples"),
        ((torch.zeros(4), [1, 2, 3, 4]), 0.2, TypeError, "pass tensors .x, y, ....*got Tensor, list"),
        ((torch.zeros(4),), 1.0, ValueError, r"valid_pct=1.0 must be in \[0, 1\)"),
    ],
)
def test_from_tensors_refuses_with_one_message(tensors, valid_pct, error, message):
    with pytest.raises(error, match=message):
        hs.DataLoaders.from_tensors(*tensors, valid_pct=valid_pct)
