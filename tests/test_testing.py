import torch

import hookscope as hs
from hookscope.testing import synth_dbunch, synth_learner


def test_synth_dbunch_is_fastais_linear_regression():
    torch.manual_seed(0)
    dls = synth_dbunch(a=2, b=3, bs=16, n_train=10, n_valid=2)
    assert isinstance(dls, hs.DataLoaders)
    assert (len(dls.train), len(dls.valid)) == (10, 2)
    x, y = dls.train.dataset.tensors
    assert x.shape == y.shape == (160, 1)
    assert (y - (2 * x + 3)).std() < 0.2  # the noise is 0.1 * a standard normal


def test_synth_learner_trains_toward_the_true_a_and_b():
    torch.manual_seed(0)
    learn = synth_learner(lr=1e-2, progress=False)
    assert isinstance(learn, hs.Learner)
    learn.fit(6)
    losses = [row["train_loss"] for row in learn.recorder.history]
    assert losses[-1] < losses[0] / 10
    assert abs(learn.model.a.item() - 2) < 0.1
    assert abs(learn.model.b.item() - 3) < 0.1


def test_synth_learner_passes_cbs_and_other_keywords_to_the_learner():
    class CountParamCallback(hs.Callback):
        def before_fit(self):
            self.n = self.count_parameters(self.learn.model)

        def count_parameters(self, model):
            return sum(p.numel() for p in model.parameters() if p.requires_grad)

    learn = synth_learner(cbs=[CountParamCallback()], progress=False)
    learn.fit(2)
    assert learn.count_param.n == 2
    assert isinstance(learn.opt, torch.optim.SGD) and learn.opt.defaults["momentum"] == 0.9


def test_synth_learner_n_trn_n_val_and_data():
    dls = synth_learner(n_trn=3, n_val=1).dls
    assert (len(dls.train), len(dls.valid)) == (3, 1)
    data = synth_dbunch(n_train=4)
    assert synth_learner(data=data).dls is data


def test_hs_testing_is_the_module():
    assert hs.testing.synth_learner is synth_learner
