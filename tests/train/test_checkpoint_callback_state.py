"""What callbacks own goes into checkpoints: a callback whose ``state_dict`` holds a module and optimizers —
one of them swapped in as ``learn.opt``, as article 004's CycleGAN trainer does — saves, loads into a fresh
Learner with a fresh callback, and resumes mid-epoch bitwise; a mismatch is one line naming the callback."""

import pytest
import torch
from small_learner import StopAtStep, tiny_learner, weights
from torch import nn

import hookscope as hs
from hookscope.train.checkpoint import CheckpointError

pytestmark = pytest.mark.usefixtures("deterministic")  # bitwise-equal resume needs it (conftest.py)


class Adversary(hs.Callback):
    """Owns a critic (a module outside the model) and two optimizers: the critic's, made at once, and the
    model's own, made in ``before_fit`` and swapped in as ``learn.opt`` in ``before_train``.

    The critic scores the model's predictions; the model's loss adds that score, and ``after_batch``
    trains the critic to tell predictions from targets. Its loss goes to the Recorder."""

    def __init__(self, critic_out=1, groups=1):
        self.critic = _critic(critic_out)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=1e-2)
        self.groups = groups
        self.opt = None

    def before_fit(self):
        if self.opt is None:
            layers = list(self.learn.model.children())
            params = [{"params": layers[0].parameters()}, {"params": layers[3].parameters()}]
            self.opt = torch.optim.Adam(
                params if self.groups == 2 else self.learn.model.parameters(), lr=1e-2
            )

    def before_train(self):
        self.learn.opt = self.opt

    def after_loss(self):
        if self.learn.training:
            self.learn.loss_grad = self.learn.loss_grad + 0.1 * self.critic(self.learn.pred).mean()

    def after_batch(self):
        if not self.learn.training:
            return
        target = nn.functional.one_hot(self.learn.yb[0], 3).float()
        loss = self.critic(self.learn.pred.detach()).mean() - self.critic(target).mean()
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        self.critic_opt.zero_grad()
        self.learn.recorder.record(critic_loss=loss.detach())

    def state_dict(self):
        return {"critic": self.critic, "opts": [self.opt, self.critic_opt]}


def _critic(n_out):
    with torch.random.fork_rng(devices=[]):  # the critic's init must not shift the run's random stream
        torch.manual_seed(1)
        return nn.Linear(3, n_out)


def saved_mid_epoch(tmp_path, n_epoch, step):
    """Train with an Adversary, save after optimizer step ``step`` and stop there; the checkpoint."""
    ckpt = hs.callbacks.Checkpoint(tmp_path, every_n_steps=step)
    tiny_learner(cbs=[Adversary(), ckpt, StopAtStep(step)]).fit(n_epoch)
    return tmp_path / "last.pt"


def adam_moments(opt):
    return [
        t for state in opt.state_dict()["state"].values() for t in (state["exp_avg"], state["exp_avg_sq"])
    ]


def equal(xs, ys):
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys, strict=True))


def test_a_callback_owning_optimizers_and_a_module_resumes_mid_epoch_bitwise(tmp_path):
    reference = tiny_learner(cbs=[Adversary()])
    reference.fit(3)

    path = saved_mid_epoch(tmp_path, n_epoch=3, step=7)  # after batch 2 of epoch 1 (5 batches an epoch)
    torch.manual_seed(42)  # the resumed process starts elsewhere
    resumed = tiny_learner(seed=9, cbs=[Adversary(), hs.callbacks.Checkpoint(tmp_path)])
    resumed.fit(3, resume=path)

    ref, res = reference.adversary, resumed.adversary
    assert equal(weights(reference), weights(resumed))
    assert equal(list(ref.critic.parameters()), list(res.critic.parameters()))
    assert equal(adam_moments(ref.opt), adam_moments(res.opt))
    assert equal(adam_moments(ref.critic_opt), adam_moments(res.critic_opt))
    assert resumed.opt is res.opt and resumed.training_step == reference.training_step == 15
    assert [row["critic_loss"] for row in resumed.recorder.history] == [
        row["critic_loss"] for row in reference.recorder.history
    ]


def test_the_checkpoint_stores_the_owned_objects_states_and_names_learn_opts_owner(tmp_path):
    learn = tiny_learner(cbs=[Adversary()])
    learn.fit(1)
    raw = torch.load(learn.save(tmp_path / "state.pt"), weights_only=True)

    assert raw["optimizer"] is None  # learn.opt is stored once, where its owner keeps it
    assert raw["optimizer_owner"] == {"callback": "adversary", "path": ["opts", 0]}
    saved = raw["callbacks"]["adversary"]
    assert saved["critic"]["hookscope.object"] == "Linear"
    assert torch.equal(saved["critic"]["state"]["weight"], learn.adversary.critic.weight)
    assert [o["hookscope.object"] for o in saved["opts"]] == ["Adam", "Adam"]
    assert saved["opts"][0]["state"]["state"][0]["step"] == 5


def test_load_into_a_fresh_learner_gives_back_the_module_at_once_and_the_optimizer_when_built(tmp_path):
    learn = tiny_learner(cbs=[Adversary()])
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")

    fresh = tiny_learner(seed=3, cbs=[Adversary()])
    fresh.load(path)  # failed before: the model's default optimizer vs the callback's parameter groups
    assert equal(weights(learn), weights(fresh))
    assert equal(list(learn.adversary.critic.parameters()), list(fresh.adversary.critic.parameters()))
    assert equal(adam_moments(learn.adversary.critic_opt), adam_moments(fresh.adversary.critic_opt))
    assert fresh.adversary.opt is None  # built in before_fit; its state waits until then
    fresh.fit(1, cbs=[StopAtStep(1)])
    assert fresh.adversary.opt.state_dict()["state"][0]["step"] == 6  # 5 saved steps, then one more


def test_an_owned_optimizer_with_other_parameter_groups_is_one_line_naming_the_callback(tmp_path):
    path = saved_mid_epoch(tmp_path, n_epoch=1, step=2)
    other = tiny_learner(cbs=[Adversary(groups=2), hs.callbacks.Checkpoint(tmp_path)])
    with pytest.raises(CheckpointError) as err:
        other.fit(1, resume=path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"{path}: Adversary.state_dict()['opts'][0]: parameter groups of [4] parameters"
    )
    assert "vs [2, 2] in this optimizer; build the optimizer with the same parameter groups" in message


def test_an_owned_module_that_does_not_fit_is_refused_before_anything_loads(tmp_path):
    learn = tiny_learner(cbs=[Adversary()])
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")

    other = tiny_learner(seed=3, cbs=[Adversary(critic_out=2)])
    before = weights(other)
    with pytest.raises(CheckpointError, match=r"Adversary.state_dict\(\)\['critic'\] was saved from another"):
        other.load(path)
    assert equal(before, weights(other))  # nothing changed


def test_a_missing_callback_that_owned_learn_opt_is_one_line_naming_it(tmp_path):
    learn = tiny_learner(cbs=[Adversary()])
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")

    with pytest.raises(CheckpointError) as err:
        tiny_learner().load(path)
    assert str(err.value) == (
        f"{path} holds learn.opt and the state of Adversary.state_dict()['critic'], ['opts'][0], "
        "['opts'][1], but this Learner has no callback 'adversary'; add Adversary() to cbs as the saved "
        "run had it"
    )


def test_a_save_before_the_owned_optimizer_is_built_keeps_its_saved_state(tmp_path):
    learn = tiny_learner(cbs=[Adversary()])
    learn.fit(1)
    path = learn.save(tmp_path / "state.pt")

    loaded = tiny_learner(seed=3, cbs=[Adversary()])
    loaded.load(path)  # the optimizer made in before_fit does not exist yet
    again = torch.load(loaded.save(tmp_path / "again.pt"), weights_only=True)
    assert again["callbacks"]["adversary"]["opts"][0]["state"]["state"][0]["step"] == 5


class Counter(hs.Callback):
    """Counts its training batches; its state is that count."""

    def __init__(self):
        self.batches = 0

    def after_batch(self):
        self.batches += self.learn.training

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


def test_a_callbacks_key_is_its_state_key_when_set_so_a_renamed_class_still_loads_old_checkpoints(tmp_path):
    from hookscope.train.checkpoint import load_checkpoint

    learn = tiny_learner(cbs=[Counter()])
    learn.fit(1)
    learn.save(tmp_path / "a.pt")
    assert "counter" in load_checkpoint(tmp_path / "a.pt")["callbacks"]

    class RenamedCounter(Counter):
        state_key = "counter"  # the class was renamed; its checkpoints keep the old key

    fresh = RenamedCounter()
    tiny_learner(cbs=[fresh]).load(tmp_path / "a.pt")
    assert fresh.batches == learn.counter.batches > 0
