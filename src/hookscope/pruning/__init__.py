"""Pruning through hooks (article 003): masks chosen by magnitude, randomness, activations or Taylor scores,
and physical removal of pruned channels.

One module per job:

- ``importance``: how much each weight or channel matters; ``activation`` and ``taylor`` are measured
  through forward and tensor hooks over data;
- ``masks``: ``prune()``, ``sparsity()``, ``finalize_pruning()`` on ``torch.nn.utils.prune``, and the masks
  of a pruned checkpoint restored on a fresh model;
- ``compact``: ``compact()`` removes fully pruned channels with Torch-Pruning's dependency graph.

This layer imports ``hooks`` only; the training loop's ``Pruning`` callback lives in ``callbacks/``.
"""
