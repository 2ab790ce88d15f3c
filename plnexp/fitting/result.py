""":class:`FitResult`: a finished fit, the value a user keeps (see docs/how-to/use-a-fitted-model.md):
it pickles, saves and loads (:mod:`plnexp.fitting.saved`), and names its parameters after the data
(:class:`DataNames`) as pandas DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from ..core.model import PCA_NAME
from ..measure import criteria, timing
from . import pca_axes, saved

if TYPE_CHECKING:
    import pandas as pd

    from ..core.data import Data

__all__ = ["DataNames", "FitResult", "INTERCEPT", "load_fit"]

INTERCEPT = "intercept"  # the intercept's name among the covariates (plnexp.core.data_checks.design_matrix's)


@dataclass(frozen=True)
class DataNames:
    """What a fit keeps of its data's names: the ``p`` variables (None: unnamed, shown as ``y1..yp``),
    the ``d`` covariates (intercept first, :data:`INTERCEPT`), the names of the rows the fit holds
    (None: unnamed, a RangeIndex from ``first_row``), the whole data set's number of samples ``n``
    (BIC's; more than the rows held in one process of a fit across processes) and the data's name."""

    variables: tuple[str, ...] | None
    covariates: tuple[str, ...]
    rows: tuple[str, ...] | None
    n: int
    first_row: int = 0
    data: str = "data"

    @classmethod
    def of(cls, data: Data) -> DataNames:
        part = data.part
        return cls(
            data.columns,
            tuple(data.covariate_names),
            data.row_names,
            data.n if part is None else part.n,
            0 if part is None else part.start,
            data.name,
        )


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
    names: DataNames | None = None  # the data's (None: a result made by hand; generic names)
    # how the fit ended (plnexp.measure.convergence.ending; None/NaN: a result made by hand): converged, the
    # best ELBO it reached minus its final one (nats, compiled), and whether that gap is within its rounding
    converged: bool | None = None
    gap_to_best: float = float("nan")
    at_best: bool | None = None

    def __repr__(self) -> str:
        """One line (the curve and the parameters are never printed: they are n x p arrays): the
        model, strategy and optimizer, the iterations run of those asked for (``len(elbo)``), the
        final ELBO (``loglik``), the precision and device, and the time per iteration when timed:
        ``FitResult(profiled, scan, rprop, 1000/1000 iterations, ELBO -1.23457e+04, BIC -1.31e+04, ICL
        -1.29e+04, 345 parameters, float32, cpu, <t> ms/iter)`` (BIC, ICL and the number of parameters:
        :mod:`plnexp.measure.criteria`; the named parameters: :attr:`coefficients`, :attr:`covariance`,
        :attr:`loadings`, :attr:`latent`)."""
        ms = self.timing.ms_per_iter
        timed = f", {ms:.3g} ms/iter" if np.isfinite(ms) else ""
        batch = f", replicate {self.replicate}" if self.replicate else ""
        return (
            f"{type(self).__name__}({self.model}, {self.strategy}, {self.optimizer}, {self.n_iter}/{len(self.elbo)} "
            f"iterations, ELBO {self.loglik:.6g}{self._criteria_text()}, {self.precision}, {self.device}{timed}{batch})"
        )

    def _criteria_text(self) -> str:
        """``, BIC b, ICL i, k parameters`` (nothing for parameters without B and S: a result made by hand)."""
        try:
            return f", BIC {self.bic:.6g}, ICL {self.icl:.6g}, {self.n_params} parameters"
        except (KeyError, ValueError, TypeError, IndexError):
            return ""

    # ------------------------------------------------------------------ the fit, named
    def save(self, path) -> None:
        """Write the fit to the folder ``path`` in plnexp's fit format (:mod:`plnexp.fitting.saved`);
        :func:`plnexp.load_fit` reads it back."""
        saved.save(self, path)

    @property
    def rank(self) -> int | None:
        """PLN-PCA's q (None for the full PLN)."""
        return int(np.shape(self.params["C"])[1]) if self.model == PCA_NAME else None

    @property
    def n_samples(self) -> int:
        """The data set's number of samples (all its rows, in a fit across processes too)."""
        return self.names.n if self.names is not None else int(np.shape(self.params["M"])[0])

    @property
    def n_params(self) -> int:
        """The number of free parameters (:func:`plnexp.measure.criteria.n_params`, PLNmodels')."""
        d, p = np.shape(self.params["B"])
        return criteria.n_params(self.model, int(p), int(d), self.rank)

    @property
    def bic(self) -> float:
        """``loglik - n_params/2 log n`` (larger is better; :func:`plnexp.measure.criteria.bic`)."""
        return criteria.bic(self.loglik, self.n_params, self.n_samples)

    @property
    def icl(self) -> float:
        """``BIC - entropy(S)`` (larger is better; :func:`plnexp.measure.criteria.icl`). In a fit across
        processes, the entropy of this process's rows."""
        return criteria.icl(self.loglik, self.n_params, self.n_samples, self.params["S"])

    def _variables(self) -> pd.Index:
        """The variables' names (``y1..yp`` where the data had none), as a DataFrame's axis."""
        import pandas as pd

        p = int(np.shape(self.params["B"])[1])
        named = self.names.variables if self.names is not None else None
        return pd.Index(list(named) if named is not None else [f"y{j + 1}" for j in range(p)], name="variable")

    def _rows(self):
        import pandas as pd

        n = int(np.shape(self.params["M"])[0])
        if self.names is not None and self.names.rows is not None:
            return pd.Index(self.names.rows, name="sample")
        start = self.names.first_row if self.names is not None else 0
        return pd.RangeIndex(start, start + n, name="sample")

    def _axis_names(self) -> pd.Index:
        import pandas as pd

        return pd.Index([f"PC{k + 1}" for k in range(int(np.shape(self.params["M"])[1]))], name="axis")

    @property
    def coefficients(self) -> pd.DataFrame:
        """B as a DataFrame: covariates (rows, :data:`INTERCEPT` first) x variables (columns)."""
        import pandas as pd

        d = int(np.shape(self.params["B"])[0])
        names = self.names.covariates if self.names is not None else (INTERCEPT, *(f"x{k}" for k in range(1, d)))
        return pd.DataFrame(self.params["B"], index=pd.Index(names, name="covariate"), columns=self._variables())

    @property
    def covariance(self) -> pd.DataFrame:
        """The latent covariance, variables x variables: Sigma (full, profiled); C C' for PLN-PCA
        (of rank q)."""
        import pandas as pd

        if self.rank is None:
            sigma = self.params["Sigma"]
        else:
            C = np.asarray(self.params["C"], dtype=np.float64)
            sigma = C @ C.T
        return pd.DataFrame(sigma, index=self._variables(), columns=self._variables())

    @cached_property
    def _axes(self) -> pca_axes.Axes:
        if self.rank is None:
            raise AttributeError(
                f"model={self.model!r}: loadings, scores and to_anndata are PLN-PCA's (model='pca'); "
                "this fit's latent covariance is res.covariance"
            )
        return pca_axes.axes(self.params["C"], self.params["M"])

    @property
    def loadings(self) -> pd.DataFrame:
        """PLN-PCA: the orthonormal loadings, variables x PC1..PCq, ordered by the variance they carry
        (:mod:`plnexp.fitting.pca_axes`)."""
        import pandas as pd

        return pd.DataFrame(self._axes.loadings, index=self._variables(), columns=self._axis_names())

    @property
    def variance_ratio(self) -> np.ndarray:
        """PLN-PCA: each axis's share of the latent covariance C C''s trace, decreasing."""
        return self._axes.variance_ratio

    @property
    def latent(self) -> pd.DataFrame:
        """The latent positions, rows named after the data's (a RangeIndex where they have none): M,
        samples x variables, for the full PLN (net of offsets and covariates: the latent mean is
        O + XB + M); for PLN-PCA, the scores on the ordered axes, samples x PC1..PCq (``latent @
        loadings.T`` = M C')."""
        import pandas as pd

        if self.rank is None:
            return pd.DataFrame(self.params["M"], index=self._rows(), columns=self._variables())
        return pd.DataFrame(self._axes.scores, index=self._rows(), columns=self._axis_names())

    def rotated_params(self) -> dict:
        """PLN-PCA: the parameters on the ordered axes, B, C V, M V and each row's posterior
        covariance ``S_cov`` (n, q, q): the same model, the same ELBO (:mod:`plnexp.fitting.pca_axes`)."""
        return pca_axes.rotated_params(self.params, self._axes.rotation)

    def to_anndata(self, adata) -> None:
        """PLN-PCA: write the fit into the AnnData it was fitted on, in place, as ``scanpy.tl.pca``
        does: ``obsm["X_pln_pca"]`` the scores (:attr:`latent`), ``varm["PLN_loadings"]`` the
        loadings, ``uns["pln_pca"]`` the rank, variance, variance_ratio, ELBO and plnexp's version;
        then e.g. ``scanpy.pp.neighbors(adata, use_rep="X_pln_pca")``."""
        from ..system.version import VERSION

        axes = self._axes
        uns = {
            "rank": self.rank,
            "variance": axes.variance,
            "variance_ratio": axes.variance_ratio,
            "elbo": float(self.loglik),
            "plnexp_version": VERSION,
        }
        names = self.names
        rows = names.rows if names is not None else None
        pca_axes.write_anndata(adata, axes.scores, axes.loadings, uns, rows, names.variables if names else None)


def load_fit(path) -> FitResult:
    """The fit saved in the folder ``path`` by :meth:`FitResult.save` (:mod:`plnexp.fitting.saved`);
    ``runs:/RUN_ID``: :func:`plnexp.load_fit`."""
    return saved.load(path, FitResult, DataNames)
