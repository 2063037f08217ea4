"""Plain training loops for the timing rules, and :class:`Feed`, which feeds a TimingRecorder from them the
way ``hs.watch`` does (see ``protocol_loops.Feed``); the recorder hooks the model's root forward itself."""

import gc
import mmap
import time

import numpy as np
import protocol_loops
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hookscope.doctor.timing import TimingRecorder


class Feed(protocol_loops.Feed):
    """The protocol tests' feed (log, step hooks, checks, close) driving a TimingRecorder."""

    def __init__(self, model, optimizer, check_every=10, start=0, state=None, **options):
        self.recorder = TimingRecorder(**options)
        self.recorder.attach(model)
        if state is not None:
            self.recorder.load_state_dict(state)
        self.check_every, self.step, self.found = check_every, start, []
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.recorder.gradients_ready()),
            optimizer.register_step_post_hook(lambda *_: self._stepped()),
        ]
        self.recorder.begin_batch(start, training=True)


def cnn() -> nn.Sequential:
    """A small CNN for 1x16x16 images: a few milliseconds per step of 32 on one core."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 256, 10),
    )


def images(n=512):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 16, 16, generator=gen), torch.randint(0, 10, (n,), generator=gen)


class SlowImages(Dataset):
    """In-memory images whose ``__getitem__`` sleeps ``delay`` seconds (a decode, a network read)."""

    def __init__(self, delay, n=512):
        self.x, self.y = images(n)
        self.delay = delay

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def in_memory(batch_size=32, **options) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(*images()), batch_size=batch_size, shuffle=True, generator=gen, **options)


def train(model, optimizer, feed, loader, steps, every_step=None):
    """The textbook loop for ``steps`` optimizer steps; ``every_step(i)`` runs before each step's
    forward (a stall, a leak)."""
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    while done < steps:
        for x, y in loader:
            if every_step is not None:
                every_step(done)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            feed.log(loss)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                return


def run(data, steps, every_step=None, on_forward=None, **options):
    """A fresh CNN and SGD trained ``steps`` steps on ``data``, fed to a TimingRecorder; the Feed.
    ``on_forward(step)`` runs inside each training forward (a leaking hook)."""
    torch.set_num_threads(1)
    model = cnn()
    if on_forward is not None:
        model.register_forward_hook(lambda *_: on_forward(feed.step))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    feed = Feed(model, opt, **options)
    train(model, opt, feed, data, steps, every_step)
    return feed


def collect_earlier_garbage():
    """Free the garbage of earlier tests now: a collection in the middle of a leak test gives back tens
    of MB there, and the memory samples after that drop are too few for memory_growth."""
    gc.collect()


class Leak:
    """Keeps a new buffer of ``mb`` megabytes (pages touched) at every call from step ``start`` on: a
    leak in the loop; ``once``: only at step ``start`` (a cache filled once). The buffers are mapped
    afresh (``mmap``), so each adds to the resident memory even where the allocator holds memory that
    earlier tests freed (it would fill that first, unseen by the resident size). ``seconds``: what each
    call took on the thread's clock."""

    def __init__(self, mb=2.0, start=0, once=False):
        self.size = int(mb * (1 << 20))
        self.start, self.once = start, once
        self.kept, self.seconds = [], []

    def __call__(self, step):
        began = time.thread_time()
        if step == self.start or (step > self.start and not self.once):
            self.kept.append(self._touched(self.size))
        self.seconds.append(time.thread_time() - began)

    @staticmethod
    def _touched(size):
        buffer = mmap.mmap(-1, size)
        np.frombuffer(buffer, dtype=np.uint8)[:] = 1
        return buffer

    def back(self, steps):
        """Touch and free the memory of ``steps`` calls before the run. A fresh virtual machine backs a
        page on its first touch only, at several microseconds a page: a leak that runs out of pages
        freed earlier in the process slows midway (2 MB a step took 6.6 ms instead of 1.2 ms here), which
        is a true slowdown of the forward that ``slow_layers`` reports. Freed pages are reused first."""
        self._touched(self.size * steps).close()

    def grew(self, latest=32, by=2e-3):
        """Whether the leak's own calls took ``by`` seconds more in the ``latest`` than in the first."""
        first, last = np.median(self.seconds[:latest]), np.median(self.seconds[-latest:])
        return last - first >= by


def stall_every(period, seconds):
    def stall(step):
        if step and step % period == 0:
            time.sleep(seconds)

    return stall
