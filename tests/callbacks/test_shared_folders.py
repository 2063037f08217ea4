"""Fits side by side never share a folder: a checkpoint folder in use, or a RunFolder being written, is
refused to a second fit — in another process or in this one — naming the holder; once the holder is done
the folder is free."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from small_learner import tiny_learner

import hookscope
import hookscope as hs
from hookscope.folder_lock import FolderBusyError, holder
from hookscope.staged_folder import StagedFolder

# A fit in its own process that saves its first epoch, says so, and waits (holding the folder) until its
# stdin closes: the test's event, no sleep.
FIT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    import hookscope as hs
    from small_learner import tiny_learner

    class Pause(hs.Callback):
        order = 95  # after the Checkpoint has saved the epoch
        def after_epoch(self):
            if self.learn.epoch == 0:
                print("saved", flush=True)
                sys.stdin.read()

    tiny_learner([hs.callbacks.Checkpoint(sys.argv[1]), Pause()]).fit(2)
    """
)


@pytest.mark.timeout(300)
def test_a_checkpoint_folder_in_use_by_another_process_is_refused(tmp_path):
    tests = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": str(Path(hookscope.__file__).parents[1])}
    other = subprocess.Popen(
        [sys.executable, "-c", FIT, str(tmp_path / "ckpt"), tests],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert other.stdout.readline() == "saved\n"
        theirs = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)["position"]
        learn = tiny_learner([hs.callbacks.Checkpoint(tmp_path / "ckpt")])
        with pytest.raises(FolderBusyError) as refused:
            learn.fit(1)
        message = str(refused.value)
        assert f"the checkpoint folder {tmp_path / 'ckpt'} is in use by pid {other.pid} on " in message
        mine = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)["position"]
        assert mine == theirs  # nothing of this fit went into their folder
        other.stdin.close()
        assert other.wait(timeout=120) == 0
    finally:
        other.kill()
        other.wait(timeout=30)
    assert holder(tmp_path / "ckpt") is None
    learn.fit(1)  # the folder is free again
    assert torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)["position"]["n_epoch"] == 1


def test_a_run_folder_being_written_is_refused_to_a_second_fit_in_this_process(tmp_path):
    class SecondFit(hs.Callback):
        """While the first fit writes its run folder, a second Learner tries the same one."""

        def after_epoch(self):
            second = tiny_learner([hs.callbacks.RunFolder(tmp_path / "run", figures=False, overwrite=True)])
            with pytest.raises(FolderBusyError, match=f"in use by pid {os.getpid()} on "):
                second.fit(1)

    first = tiny_learner([hs.callbacks.RunFolder(tmp_path / "run", figures=False, checkpoints=True)])
    first.fit(1, cbs=[SecondFit()])
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # published, its lock given back
    second = tiny_learner([hs.callbacks.RunFolder(tmp_path / "run", figures=False, overwrite=True)])
    second.fit(1)  # the first is done: replacing its run is allowed now


def test_watch_refuses_a_report_folder_another_writer_is_writing(tmp_path):
    writer = StagedFolder.start(tmp_path / "run")  # e.g. a fit writing its run
    model = torch.nn.Linear(2, 2)
    with pytest.raises(FolderBusyError, match=f"the run folder {tmp_path / 'run'} is in use by pid"):
        hs.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), path=tmp_path / "run")
    writer.finish()
