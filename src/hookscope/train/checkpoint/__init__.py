"""Checkpoints: the full training state in one file that loads safely, writes atomically, resumes exactly.

One module per job:

- ``file.py``: the on-disk format — format marker and version, CRC32 checksum, atomic write and link,
  ``torch.load(weights_only=True)`` loading, :class:`CheckpointError`.
- ``rng.py``: capturing and restoring every RNG (python, numpy, torch, CUDA, DataLoader generators).
- ``weights.py``: the model inside a DDP wrapper, and whether a saved ``state_dict`` fits a model.
- ``export.py``: a model's weights as a safetensors file.
- ``callback_state.py``: what callbacks own — their ``state_dict``, with the optimizers and modules in it.
- ``learner_state.py``: save and load a Learner — model, pending gradients, optimizer, callbacks, RNGs,
  loop position.
- ``identity.py``: whose run a checkpoint is, so a resume continues its own run only.
- ``resume.py``: ``fit(resume=...)`` — finding the file, applying it at the right moments of the loop,
  replaying a mid-epoch shuffle.

Every name is re-exported here, so ``from hookscope.train import checkpoint`` then ``checkpoint.<name>``
reaches all of them.
"""

from hookscope.train.checkpoint.callback_state import PendingObject, load_pending_objects
from hookscope.train.checkpoint.export import export_safetensors
from hookscope.train.checkpoint.file import (
    FORMAT,
    VERSION,
    CheckpointError,
    check_plain,
    link_atomic,
    load_checkpoint,
    write_checkpoint,
)
from hookscope.train.checkpoint.identity import check_identity, run_identity
from hookscope.train.checkpoint.learner_state import (
    Position,
    current_position,
    load_learner,
    load_model_and_callbacks,
    load_optimizer,
    save_learner,
)
from hookscope.train.checkpoint.resume import Resume, find_latest, train_batches
from hookscope.train.checkpoint.rng import capture_rng, loader_generators, restore_rng, rng_generators
from hookscope.train.checkpoint.weights import check_model_state, unwrap

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "PendingObject",
    "Position",
    "Resume",
    "capture_rng",
    "check_identity",
    "check_model_state",
    "check_plain",
    "current_position",
    "export_safetensors",
    "find_latest",
    "link_atomic",
    "load_checkpoint",
    "load_learner",
    "load_model_and_callbacks",
    "load_optimizer",
    "load_pending_objects",
    "loader_generators",
    "restore_rng",
    "rng_generators",
    "run_identity",
    "save_learner",
    "train_batches",
    "unwrap",
    "write_checkpoint",
]
