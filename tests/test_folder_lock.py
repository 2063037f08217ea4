"""One writer per folder: the lock is refused to a second writer (another process or this one), names the
holder, goes with its process (kill -9 included) and is taken over once stale."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hookscope
from hookscope.folder_lock import FolderBusyError, FolderLock, holder, lock_path

# A writer in its own process: takes the lock, says so, and holds it until its stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from hookscope.folder_lock import FolderLock
    lock = FolderLock(sys.argv[1], "the run folder").acquire()
    print("held", flush=True)
    sys.stdin.read()
    lock.release()
    """
)


@pytest.fixture
def other_writer(tmp_path):
    """Start a process holding the lock of a folder; yields (process, folder) once it holds it."""
    started = []

    def start(folder):
        env = {**os.environ, "PYTHONPATH": str(Path(hookscope.__file__).parents[1])}
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(process)
        assert process.stdout.readline() == "held\n"  # it holds the lock now: no sleep needed
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=30)


def test_a_second_writer_in_this_process_is_refused_until_the_first_releases(tmp_path):
    first = FolderLock(tmp_path / "run", "the run folder").acquire()
    with pytest.raises(FolderBusyError) as refused:
        FolderLock(tmp_path / "run", "the run folder").acquire()
    message = str(refused.value)
    who = f"pid {os.getpid()} on {socket.gethostname()}"
    assert f"the run folder {tmp_path / 'run'} is in use by {who} since 20" in message
    assert "\n" not in message
    first.release()
    assert not lock_path(tmp_path / "run").exists()  # a clean release leaves nothing behind
    with FolderLock(tmp_path / "run") as second:
        assert second.held and second.stale is None


@pytest.mark.timeout(120)
def test_a_writer_in_another_process_is_named_and_its_exit_frees_the_folder(tmp_path, other_writer):
    process = other_writer(tmp_path / "run")
    assert holder(tmp_path / "run")["pid"] == process.pid
    with pytest.raises(FolderBusyError, match=f"in use by pid {process.pid} on "):
        FolderLock(tmp_path / "run").acquire()
    process.stdin.close()  # the writer finishes
    assert process.wait(timeout=60) == 0
    assert holder(tmp_path / "run") is None
    assert FolderLock(tmp_path / "run").acquire().held


@pytest.mark.timeout(120)
def test_a_lock_left_by_kill_9_is_stale_and_taken_over(tmp_path, other_writer):
    process = other_writer(tmp_path / "run")
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert lock_path(tmp_path / "run").is_file()  # the dead writer's record stays on disk...
    assert holder(tmp_path / "run") is None  # ...but it is no one's
    lock = FolderLock(tmp_path / "run").acquire()
    assert lock.stale["pid"] == process.pid  # whose it was, for the "unfinished run" message
    assert holder(tmp_path / "run")["pid"] == os.getpid()


def test_a_lock_is_handed_over_without_a_gap(tmp_path):
    early = FolderLock(tmp_path / "run").acquire()
    writer = FolderLock(tmp_path / "run")
    writer.take_over(early)
    assert writer.held and not early.held
    with pytest.raises(FolderBusyError):
        FolderLock(tmp_path / "run").acquire()
    with pytest.raises(ValueError, match="lock the same folder"):
        FolderLock(tmp_path / "other").take_over(writer)


def test_a_released_lock_leaves_no_folder_it_made(tmp_path):
    lock = FolderLock(tmp_path / "runs" / "deep" / "run").acquire()
    assert lock_path(tmp_path / "runs" / "deep" / "run").is_file()
    lock.release()
    assert list(tmp_path.iterdir()) == []  # a refused command writes nothing, not even runs/
    kept = FolderLock(tmp_path / "runs" / "run").acquire()
    (tmp_path / "runs" / "run").mkdir()  # the writer wrote its folder: runs/ stays
    kept.release()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["run"]
