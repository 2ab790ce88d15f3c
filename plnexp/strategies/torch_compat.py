"""PyTorch's private APIs that the PyTorch baselines use (:mod:`plnexp.strategies.torch_pln`), behind
one shim (docs/development.md, "Private APIs"). Written for torch 2.13.0 (the ``torch`` extra's pin).
Imported only where torch is (the baselines), never at ``plnexp.strategies``' import.

Inductor's on-disk caches are turned off through the public ``torch.compiler.config``
(``force_disable_caches``, of which ``torch._inductor.config``'s is an alias in torch 2.13): no shim.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..system.versions import gate

TORCH = "2.13.0"  # the torch release the shim was written for (its local part, +cpu, left out)


@contextmanager
def error_on_recompile() -> Iterator[type[Exception]]:
    """Inside the block, a recompile by TorchDynamo raises instead of compiling again; yields the
    exception class it raises, whose text names the guard that failed.

    Wraps ``torch._dynamo.config.patch(error_on_recompile=True)`` and
    ``torch._dynamo.exc.RecompileError`` (torch 2.13.0): the public
    ``torch.compiler.set_stance("fail_on_recompile")`` raises a plain RuntimeError and its stance is
    the process's, not the block's. Gate: on another torch, warns, then uses them anyway (an
    AttributeError names what the release lacks)."""
    gate("torch", TORCH, "torch_compat.error_on_recompile", "using torch._dynamo's error_on_recompile anyway")
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield torch._dynamo.exc.RecompileError
