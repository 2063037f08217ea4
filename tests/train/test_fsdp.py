"""FSDP2 (``fully_shard``) under torchrun: 2 processes on CPU (gloo) against 1 process on the whole batch.

The scripts shard the model only under torchrun; in one process the same model trains unsharded on the
whole batch, so every number the doctor measures must match: statistics of a sharded parameter or
gradient are those of the whole tensor, never one rank's shard.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from launch import SCRIPT, TORCHRUN, kill_9_at_step_7, one_process, results, two_processes

WATCH = Path(__file__).with_name("fsdp_script.py")
# Norms of 2 shards' squares added, against one norm over the whole tensor (float32): measured ~5e-7.
NORM_RTOL = 1e-5

# several ranks on two cores: run alone (`make test`'s second part)
pytestmark = [pytest.mark.usefixtures("deterministic"), pytest.mark.serial]


FAULTS = {"dead": ("dead_units", "3"), "exploding": ("exploding_gradient", "7")}


@pytest.fixture(scope="module")
def faulty_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both faulty models trained in one process, then sharded on 2 ranks: one launch each for both."""
    out = tmp_path_factory.mktemp("fsdp-faults")
    one_process(WATCH, out / "one", "--models", *FAULTS)
    two_processes(WATCH, out / "two", "--models", *FAULTS)
    return out


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("model", list(FAULTS))
def test_a_fault_in_a_sharded_model_is_found_on_every_rank_as_in_one_process(
    faulty_runs: Path, model: str
) -> None:
    kind, module = FAULTS[model]
    (single,) = results(faulty_runs / "one" / model, nproc=1)
    rank0, rank1 = results(faulty_runs / "two" / model)
    assert (kind, module) in [(k, m) for k, m, _, _ in rank0["findings"]]
    assert rank0["findings"] == rank1["findings"] == single["findings"]
    assert rank0["params"] == rank1["params"]
    assert list(rank0["params"]) == list(single["params"])  # the user's names: no FSDP prefix
    for name, records in single["params"].items():
        for (step, norm, ratio), (step2, norm2, ratio2) in zip(records, rank0["params"][name], strict=True):
            assert step2 == step
            assert norm2 == pytest.approx(norm, rel=NORM_RTOL)  # the whole gradient's, not a shard's
            assert ratio2 == pytest.approx(ratio, rel=NORM_RTOL)
    for name, (count, mean, std, _) in single["stats"].items():
        count2, mean2, std2, _ = rank0["stats"][name]
        assert count2 == count  # both ranks' halves of the batch added
        assert (mean2, std2) == pytest.approx((mean, std), rel=1e-4, abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_guard_stops_every_rank_of_a_sharded_model_at_the_same_step(tmp_path: Path) -> None:
    two_processes(WATCH, tmp_path, "--models", "plain", "--nan-at", "3")
    rank0, rank1 = results(tmp_path / "plain")
    assert rank0["stopped"] == rank1["stopped"] == (3, "activation")
    assert rank0["findings"] == rank1["findings"]
    assert [k for k, *_ in rank0["findings"]] == ["nonfinite"]


# ---- the Learner -----------------------------------------------------------------------------------------

# 2 ranks x batch 12 sharded against 1 process x batch 24 (the task's bound; measured ~1.5e-8).
WEIGHT_ATOL = 1e-5


def assert_trains_as_one_process(single: dict, rank0: dict, rank1: dict) -> None:
    assert (single["world"], rank0["world"]) == (1, 2)
    for name, weight in single["weights"].items():
        torch.testing.assert_close(rank0["weights"][name], weight, rtol=0, atol=WEIGHT_ATOL)
        assert torch.equal(rank0["weights"][name], rank1["weights"][name])
    for row, row0 in zip(single["history"], rank0["history"], strict=True):
        assert row0["valid_loss"] == pytest.approx(row["valid_loss"], abs=WEIGHT_ATOL)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_the_learner_shards_with_fsdp2_and_trains_as_one_process_on_the_whole_batch(
    tmp_path: Path, whole_batch: dict
) -> None:
    single = whole_batch
    two_processes(SCRIPT, tmp_path / "learner", "--batch-size", "12", "--shard")
    two_processes(SCRIPT, tmp_path / "user", "--batch-size", "12", "--fsdp")  # sharded by the user
    for out in ("learner", "user"):
        rank0, rank1 = results(tmp_path / out)
        assert rank0["sharded"] and not single["sharded"]
        assert_trains_as_one_process(single, rank0, rank1)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_accumulated_micro_batches_reduce_gradients_once_per_step(tmp_path: Path, whole_batch: dict) -> None:
    single = whole_batch
    # 2 ranks x 2 micro-batches of 6: 24 samples per optimizer step, as in one process
    two_processes(SCRIPT, tmp_path / "fsdp", "--batch-size", "6", "--accumulate", "2", "--shard")
    two_processes(SCRIPT, tmp_path / "ddp", "--batch-size", "6", "--accumulate", "2")
    # FSDP2: one reduce-scatter per unit (the Linear layers 0 and 3) per step; DDP: one bucket per step
    for out, per_step in (("fsdp", 2), ("ddp", 1)):
        rank0, rank1 = results(tmp_path / out)
        assert rank0["steps"] == single["steps"] == 10
        assert rank0["reductions"] == per_step * rank0["steps"], out
        assert_trains_as_one_process(single, rank0, rank1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mixed_precision_reaches_the_sharding_as_fsdp2s_policy(tmp_path: Path) -> None:
    two_processes(SCRIPT, tmp_path, "--batch-size", "12", "--shard", "--bf16")
    rank0, rank1 = results(tmp_path)
    assert rank0["param_dtype"] == rank1["param_dtype"] == "torch.bfloat16"
    assert all(torch.isfinite(w).all() for w in rank0["weights"].values())
    assert rank0["weights"]["0.weight"].dtype == torch.float32  # the sharded parameters stay float32


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_float16_skips_a_step_on_every_rank_when_one_shards_gradient_overflows(tmp_path: Path) -> None:
    two_processes(SCRIPT, tmp_path, "--batch-size", "12", "--shard", "--fp16", "--fault", "inf-grad")
    rank0, rank1 = results(tmp_path)
    assert rank0["param_dtype"] == "torch.float16"
    # the Inf is in rank 1's part only; both ranks skip that step and halve the scale, once
    for rank in (rank0, rank1):
        assert rank["precision"] == {"skipped_steps": 1, "scale": 2.0**15}
        assert rank["steps"] == 2 * 5 - 1  # 2 epochs of 5 steps, one skipped
    for name, weight in rank0["weights"].items():
        assert torch.isfinite(weight).all() and torch.equal(weight, rank1["weights"][name])


# ---- sharded checkpoints (DCP) ------------------------------------------------------------------------

RUN = ["--shuffle", "--dropout", "0.3", "--epochs", "3", "--every", "3", "--doctor"]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_sharded_run_killed_with_9_resumes_exactly_from_its_dcp_checkpoint(tmp_path: Path) -> None:
    two_processes(SCRIPT, tmp_path / "whole", *RUN, "--shard", "--checkpoints", str(tmp_path / "ckpt-whole"))
    cut, ckpt = tmp_path / "cut", tmp_path / "ckpt-cut"
    command = [*TORCHRUN, "--nproc-per-node=2"]
    kill_9_at_step_7(
        [*command, str(SCRIPT), "--out", str(cut), *RUN, "--shard", "--checkpoints", str(ckpt)], cut
    )
    saved = torch.load(ckpt / "last.pt", weights_only=True)  # the learner file: plain values only
    assert saved["position"]["training_step"] == 6 and len(saved["ranks"]) == 2
    assert saved["model"] == {} and saved["sharded"] == "ckpt-00000006.dcp"
    assert sorted(p.name for p in (ckpt / "ckpt-00000006.dcp").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]

    two_processes(SCRIPT, cut, *RUN, "--shard", "--checkpoints", str(ckpt), "--resume")
    whole, resumed = results(tmp_path / "whole"), results(cut)
    for rank in range(2):
        for name, weight in whole[rank]["weights"].items():
            assert torch.equal(resumed[rank]["weights"][name], weight), (rank, name)
        assert [r["train_loss"] for r in resumed[rank]["history"]] == [
            r["train_loss"] for r in whole[rank]["history"]
        ]
        assert resumed[rank]["findings"] == whole[rank]["findings"]  # the doctor's state came back


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_dcp_checkpoints_reshard_from_two_ranks_to_one_and_from_one_to_two(tmp_path: Path) -> None:
    # 2 -> 1: the sharded run's last checkpoint (after its last epoch) loads into the plain model
    options = ["--epochs", "2", "--every", "100"]
    two_processes(
        SCRIPT, tmp_path / "two", *options, "--shard", "--checkpoints", str(tmp_path / "ck2"), "--export"
    )
    exported = safetensors.torch.load_file(tmp_path / "two" / "model.safetensors")  # one plain file
    one_process(SCRIPT, tmp_path / "two-to-one", *options, "--checkpoints", str(tmp_path / "ck2"), "--resume")
    (loaded,) = results(tmp_path / "two-to-one", nproc=1)
    for name, weight in results(tmp_path / "two")[0]["weights"].items():
        assert torch.equal(loaded["weights"][name], weight), name
        assert torch.equal(exported[name], weight), name
    assert not loaded["sharded"]

    # 1 -> 2: a one-process checkpoint written through DCP loads into the sharded model on 2 ranks
    one_process(SCRIPT, tmp_path / "one", *options, "--dcp", "--checkpoints", str(tmp_path / "ck1"))
    two_processes(
        SCRIPT,
        tmp_path / "one-to-two",
        *options,
        "--shard",
        "--checkpoints",
        str(tmp_path / "ck1"),
        "--resume",
    )
    (single,) = results(tmp_path / "one", nproc=1)
    for rank0 in results(tmp_path / "one-to-two"):
        assert rank0["sharded"]
        for name, weight in single["weights"].items():
            assert torch.equal(rank0["weights"][name], weight), name


def test_a_dcp_folder_naming_a_pickled_object_is_refused_before_it_loads(tmp_path: Path) -> None:
    import pickle

    from torch import nn

    from hookscope.train.checkpoint import CheckpointError, sharded

    model = nn.Linear(3, 2)
    state = sharded.save_tensors(model, None, tmp_path / "ckpt-00000001.pt")
    sharded.load_model(nn.Linear(3, 2), state, str(tmp_path / "ckpt-00000001.pt"))  # a clean one loads

    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "ckpt-00000001.dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match=r"refused to load — the DCP metadata names builtins\.print"):
        sharded.load_model(nn.Linear(3, 2), state, str(tmp_path / "ckpt-00000001.pt"))


def test_rotated_sharded_checkpoints_take_their_tensors_along_but_best_keeps_its_own(tmp_path: Path) -> None:
    from torch import nn

    import hookscope as hs

    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    # the highest training loss is the best: an early epoch's, whose numbered file is rotated away
    checkpoint = hs.callbacks.Checkpoint(tmp_path, monitor="train_loss", mode="max", sharded=True)
    learn = hs.Learner(nn.Linear(4, 2), (loader, None), nn.CrossEntropyLoss(), cbs=[checkpoint])
    learn.fit(3)
    files = sorted(p.name for p in tmp_path.iterdir())
    best = torch.load(tmp_path / "best.pt", weights_only=True)["sharded"]
    assert [f for f in files if f.endswith(".pt")] == ["best.pt", "ckpt-00000012.pt", "last.pt"]
    assert best != "ckpt-00000012.dcp"
    assert sorted(f for f in files if f.endswith(".dcp")) == [best, "ckpt-00000012.dcp"]
