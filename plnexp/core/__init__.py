"""The PLN model's numerics and data: pure functions and frozen values (model, data, reference ELBOs, optimizers, precisions, the problem a strategy solves). Imports neither Hydra nor MLflow."""
