"""The training half: events, callbacks, the Learner loop, checkpoints and distributed helpers."""
