"""The PLN fit of :mod:`plnexp.core.model` / :mod:`plnexp.core.problem` written in PyTorch, for the baselines
``torch_eager`` and ``torch_compile`` (:mod:`plnexp.strategies.torch_loops`).

Importing this package does not import torch; its modules do (``model``: ELBOs, closed forms and
gradients; ``optim``: optax's formulas; ``program``: the strategies' Programs). They are imported
only when a torch strategy is built, so ``import plnexp`` and every JAX path work without torch.
"""
