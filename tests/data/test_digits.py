import torch

from hookscope.data.digits import digits_loaders, digits_tensors


def test_shapes_dtypes_and_split_sizes():
    x_train, y_train, x_valid, y_valid = digits_tensors(valid_pct=0.2)
    assert x_train.shape == (1438, 1, 8, 8) and x_valid.shape == (359, 1, 8, 8)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert len(y_train) == 1438 and len(y_valid) == 359
    assert set(y_train.tolist()) == set(range(10))


def test_normalised_with_train_statistics():
    x_train, _, x_valid, _ = digits_tensors()
    assert abs(x_train.mean().item()) < 1e-5
    assert abs(x_train.std().item() - 1.0) < 1e-5
    assert x_valid.mean().item() != x_train.mean().item()


def test_split_is_deterministic_and_seed_dependent():
    a, b, c = digits_tensors(seed=0), digits_tensors(seed=0), digits_tensors(seed=1)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])
    assert not torch.equal(a[1], c[1])


def test_train_and_valid_do_not_overlap():
    x_train, _, x_valid, _ = digits_tensors()
    train_rows = {tuple(row.tolist()) for row in x_train.flatten(1)}
    duplicates = sum(tuple(row.tolist()) in train_rows for row in x_valid.flatten(1))
    # the raw dataset has a handful of identical images; a leaking split would share hundreds
    assert duplicates < 5


def test_upsampled_size():
    x_train, _, x_valid, _ = digits_tensors(size=32)
    assert x_train.shape[1:] == (1, 32, 32) and x_valid.shape[1:] == (1, 32, 32)


def test_bad_arguments_name_the_problem():
    for kwargs, words in [({"valid_pct": 1.5}, "valid_pct=1.5"), ({"size": 4}, "size=4")]:
        try:
            digits_tensors(**kwargs)
        except ValueError as err:
            assert words in str(err)
        else:
            raise AssertionError(f"{kwargs} was accepted")


def test_loaders_batches_and_seeded_shuffle():
    train_dl, valid_dl = digits_loaders(batch_size=32, seed=3)
    xb, yb = next(iter(train_dl))
    assert xb.shape == (32, 1, 8, 8) and yb.shape == (32,)
    first = next(iter(digits_loaders(batch_size=32, seed=3)[0]))[1]
    assert torch.equal(yb, first)
    assert sum(len(b[1]) for b in valid_dl) == 359
