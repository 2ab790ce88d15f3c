""":class:`FitResult`: a finished fit, the value a user keeps (see docs/how-to/use-a-fitted-model.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..measure import timing

__all__ = ["FitResult"]


@dataclass(frozen=True, repr=False)  # __repr__: one line, below
class FitResult:
    """A finished fit. ``elbo[i]``: ELBO (with the exact log y!) before update i; NaN past
    ``n_iter``. ``params`` (float64): B (d, p), M (n, p, centred residual), S (n, p), Sigma (p, p);
    for ``model="pca"`` of rank q: B (d, p), C (p, q), M (n, q), S (n, q), the latent mean being
    O + XB + MC'."""

    elbo: np.ndarray
    loglik: float
    params: dict
    n_iter: int
    timing: timing.Timing
    model: str
    strategy: str
    optimizer: str
    precision: str
    device: str
    extra: dict = field(default_factory=dict)
    replicate: int = 0  # its place in the program's batch (runs are identified by config hash and replicate)

    def __repr__(self) -> str:
        """One line (the curve and the parameters are never printed: they are n x p arrays): the
        model, strategy and optimizer, the iterations run of those asked for (``len(elbo)``), the
        final ELBO (``loglik``), the precision and device, and the time per iteration when timed:
        ``FitResult(profiled, scan, rprop, 1000/1000 iterations, ELBO -1.23457e+04, float32, cpu,
        <t> ms/iter)``."""
        ms = self.timing.ms_per_iter
        timed = f", {ms:.3g} ms/iter" if np.isfinite(ms) else ""
        batch = f", replicate {self.replicate}" if self.replicate else ""
        return (
            f"{type(self).__name__}({self.model}, {self.strategy}, {self.optimizer}, {self.n_iter}/{len(self.elbo)} "
            f"iterations, ELBO {self.loglik:.6g}, {self.precision}, {self.device}{timed}{batch})"
        )
