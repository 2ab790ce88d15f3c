"""The PyTorch baselines in the strategy registry: ``torch_eager`` and ``torch_compile``.

Torch is an optional extra (``pip install -e ".[torch]"``): this module never imports it. The
builders import :mod:`plnexp.strategies.torch_pln.program` when a torch strategy is built, and
:func:`check` refuses a torch strategy in one line when torch is not installed, so that a job
asking for one fails when its config is loaded, before any work.

``torch.jit.script`` (a ``torch_script`` strategy) is left out: torch 2.13 deprecates it
("Please switch to torch.compile or torch.export", a DeprecationWarning on every use).
"""

from __future__ import annotations

import importlib.util

from ..system.paths import install_command

TORCH_REQUIREMENT = "torch==2.13.0"
# torch.compile's modes (torch._inductor.list_mode_options() in torch 2.13, less its experimental "lite")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def torch_available() -> bool:
    """Whether torch can be imported (found on the path; not imported here)."""
    return importlib.util.find_spec("torch") is not None


def check(name: str, compile_cache: bool | None = False) -> None:
    """One-line ValueError if the torch strategy ``name`` cannot run here or with these options."""
    if not torch_available():
        raise ValueError(
            f"strategy={name}: PyTorch is not installed; install the optional extra: "
            f"{install_command('torch')} ({TORCH_REQUIREMENT})"
        )
    if compile_cache:
        raise ValueError(
            f"compile_cache=true: strategy={name} has no persistent compilation cache (plnexp's "
            "is JAX's; torch_compile always compiles cold); allowed values are false"
        )


def check_device(name: str, platform: str) -> None:
    """One-line ValueError if the torch strategy ``name`` cannot use the JAX device's ``platform``
    (the tensors live where the JAX arrays do: "gpu" needs a CUDA build of torch)."""
    if platform == "cpu":
        return
    import torch

    if platform != "gpu" or not torch.cuda.is_available():
        raise ValueError(
            f"device={platform}: strategy={name} needs a PyTorch build that sees this device "
            f"(torch {torch.__version__} has CUDA: {torch.cuda.is_available()}); use device=cpu"
        )


def torch_program(problem, n_iter: int, compiled: bool, mode: str = "default"):
    from .torch_pln.program import TorchProgram  # imports torch

    return TorchProgram(problem, n_iter, compiled, mode)
