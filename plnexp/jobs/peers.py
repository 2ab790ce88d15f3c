"""Peers: other packages' fits of the same PLN model, run on plnexp's data and scored like its runs.

A sweep with ``report.peers=[pyplnmodels]`` fits each peer's default fit on the sweep's data after
its grid, in the same process, and logs it as one more run of the sweep (:mod:`plnexp.experiment.peer_runs`):
a row of the same table, a curve of the same plot. A peer follows the job's model (:attr:`Peer.fits`,
:func:`following`): one peer run per data set and model it fits there. One entry today:

- ``pyplnmodels``: pyPLNmodels' default fit (its Rprop, lr 0.01, at most 400 iterations, its
  stopping criterion tol 1e-6), in PyTorch, float32, on the device it picks, of the job's model:
  ``model=full`` or ``profiled``: ``Pln(Y, exog=X, offsets=O, add_const=False).fit()`` (the PLN
  model, B and Sigma in closed form: plnexp's ``profiled``); ``model=pca`` of rank q:
  ``PlnPCA(Y, exog=X, offsets=O, rank=q, add_const=False).fit()``. Installed by the ``peers`` extra.
  ``python -m plnexp sweep sweep=pca_rank 'report.peers=[pyplnmodels]'``: one PlnPCA run per rank.

What a peer's fit returns is a :class:`plnexp.fitting.engine.FitResult`, scored on plnexp's ELBO:

- ``loglik``: the float64 host ELBO with the exact log y! at the peer's fitted parameters. PLN
  (:func:`score`): :func:`plnexp.core.reference.elbo` at its variational parameters, with B and Sigma in
  their closed forms from M and S, as pyPLNmodels computes them (:func:`closed_forms`). PLN-PCA
  (:func:`score_plnpca`, also what ``benchmarks/pca.py`` scores PlnPCA with):
  :func:`plnexp.core.reference.pca_elbo` at its fitted B, C, M and S as they are.
- ``elbo``: the peer's own ELBO per iteration (before each update, as plnexp's curve), shifted by one
  constant: ``loglik`` minus its own ELBO at the same final parameters (:func:`shifted_curve`). Its
  own ELBO differs from plnexp's by terms that do not depend on the parameters (Stirling's log y!,
  constants), so the shift is exact up to its float32 rounding (~1e-7 of the ELBO per point).
- ``timing``: ``compile_s`` 0 (nothing is compiled); ``run_s`` the median wall clock of
  ``repeats`` fits (``pln.fit()`` alone: building the model from the arrays is left out, as plnexp
  leaves out loading), after ``warmup`` untimed fits, in this process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import math
import os
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..system.commandline import first_line
from ..core import reference
from ..core.data import Data
from ..fitting.engine import FitResult
from ..core.model import PCA_NAME
from ..measure.timing import Timing
from .tags import PEER_TAG as PEER_TAG


class PeerError(RuntimeError):
    """A peer's fit that cannot be scored on plnexp's data (one line saying why)."""


@dataclass(frozen=True)
class PeerFit:
    """What a peer fits for a job's model: its class and its call, as its users write them (``{rank}``
    in the call: the job's ``model.rank``), and plnexp's name for the model it fits."""

    cls: str
    call: str
    model: str


@dataclass(frozen=True)
class Peer:
    """A package fitting the same model: how to tell it is there, what it runs (in plnexp's words,
    for its run's params) and its default fit. ``cls``, ``call``, ``model``, ``rank``: what it runs
    for a job's model (:func:`following`; as registered: its fit of the full and profiled models)."""

    name: str  # the registry key: report.peers, the run's tag and name
    label: str  # as its users spell it
    pin: str  # what the ``peers`` extra installs (the version measured here)
    call: str  # the fit it runs, as its users write it
    available: Callable[[], str | None]  # None where it can run, else why not (one line)
    fit: Callable[..., FitResult]  # fit(data, *, warmup, repeats[, rank]) -> the scored, timed fit
    versions: Callable[[], dict[str, str]]  # the packages it runs on -> their versions (its run's tags)
    uses_gpu: Callable[[], bool]  # whether its fit runs on a GPU here
    model: str = "profiled"  # plnexp's name for the model it fits
    cls: str = ""  # the class it fits with (pyPLNmodels' Pln, PlnPCA)
    rank: int | None = None  # PLN-PCA's q where it fits model=pca (passed to fit as rank=), else None
    fits: dict[str, PeerFit] = field(default_factory=dict)  # a job's model -> what it fits for it
    optimizer: str = "rprop"
    lr: float = 0.01
    precision: str = "float32"
    n_iter: int = 400  # its iteration cap (it may stop earlier: n_iter_run)
    options: dict = field(default_factory=dict)  # its other settings, logged as params peer.<key>


def model_error(peer: Peer, model: str) -> str | None:
    """None where ``peer`` follows a job of ``model``, else the one line saying which models it does."""
    if model in peer.fits:
        return None
    return (
        f"model={model} with report.peers=[{peer.name}]: allowed values are {', '.join(peer.fits) or 'none'} "
        f"(the models {peer.label} fits as a peer)"
    )


def following(peer: Peer, model: str, rank: int | None = None) -> Peer:
    """``peer`` as it runs beside a job of ``model`` (pca's ``rank``): its class, call and model
    for it (:attr:`Peer.fits`). A model it does not fit: :class:`PeerError`."""
    why = model_error(peer, model)
    if why is not None:
        raise PeerError(why)
    f = peer.fits[model]  # pca's rank: an integer >= 1, as the config checked it (plnexp.jobs.config._model)
    rank = rank if f.model == PCA_NAME else None
    return replace(peer, cls=f.cls, call=f.call.format(rank=rank), model=f.model, rank=rank)


def install_hint() -> str:
    """How to install the peers (the ``peers`` extra: torch's CPU pin first, then the peers)."""
    from ..system.paths import install_command

    return install_command("peers")


# ---------------------------------------------------------------- scoring (any peer)
def closed_forms(M, S, X) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B, the centred M and Sigma in float64 from a profiled fit's uncentred M (Z = O + M) and S:
    B = (X'X)^-1 X'M, R = M - XB, Sigma = (R'R + diag(sum_i S_i^2)) / n (pyPLNmodels' closed forms)."""
    M, S, X = (np.asarray(a, dtype=np.float64) for a in (M, S, X))
    B = np.linalg.solve(X.T @ X, X.T @ M)
    centred = M - X @ B
    Sigma = (centred.T @ centred + np.diag((S * S).sum(axis=0))) / M.shape[0]
    return B, centred, Sigma


def score(data: Data, M, S) -> tuple[float, dict]:
    """plnexp's ELBO (float64, exact log y!) at a profiled fit's M (uncentred) and S, and the
    parameters as a :class:`~plnexp.fitting.engine.FitResult` holds them (B, centred M, S, Sigma)."""
    B, centred, Sigma = closed_forms(M, S, data.X)
    S = np.asarray(S, dtype=np.float64)
    loglik = reference.elbo(data.Y, data.O, data.X, B, centred, S, Sigma)
    return loglik, {"B": B, "M": centred, "S": S, "Sigma": Sigma}


def pca_score(Y, O, X, B, C, M, S) -> tuple[float, dict]:
    """plnexp's PCA ELBO (float64, exact log y!: :func:`plnexp.core.reference.pca_elbo`) on counts ``Y``,
    log offsets ``O`` ((n, p), or plnexp's per-row view of them) and covariates ``X`` at a PLN-PCA
    fit's B (d, p), C (p, q), M (n, q) and S (n, q) as they are (nothing in closed form), and those
    parameters in float64 as a :class:`~plnexp.fitting.engine.FitResult` of model=pca holds them."""
    params = {k: np.asarray(v, dtype=np.float64) for k, v in (("B", B), ("C", C), ("M", M), ("S", S))}
    loglik = reference.pca_elbo(Y, O, X, params["B"], params["C"], params["M"], params["S"])
    return loglik, params


def plnpca_parameters(model) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A fitted pyPLNmodels ``PlnPCA``'s B (``coef``), C (``components``), M (``latent_mean``) and S
    (``latent_sqrt_variance``), in float64 on the host."""
    import torch

    with torch.no_grad():
        B, C, M, S = (
            t.detach().cpu().double().numpy()
            for t in (model.coef, model.components, model.latent_mean, model.latent_sqrt_variance)
        )
    return B, C, M, S


def score_plnpca(Y, O, X, model) -> tuple[float, dict]:
    """A pyPLNmodels ``PlnPCA`` fitted on counts ``Y``, log offsets ``O`` and covariates ``X``
    (``add_const=False``: X as it is) scored on plnexp's exact PCA ELBO: :func:`pca_score` at
    :func:`plnpca_parameters`. The one place that scores PlnPCA (:func:`pyplnmodels_fit`,
    ``benchmarks/pca.py``)."""
    return pca_score(Y, O, X, *plnpca_parameters(model))


def shifted_curve(own: np.ndarray, own_final: float, exact_final: float) -> tuple[np.ndarray, float]:
    """A peer's own ELBO curve on plnexp's scale: shifted by ``exact_final - own_final``, both at the
    same final parameters. Returns the curve (float64) and the shift."""
    shift = float(exact_final) - float(own_final)
    return np.asarray(own, dtype=np.float64) + shift, shift


# ---------------------------------------------------------------- pyPLNmodels
PYPLN_PIN = "pyPLNmodels==1.0.10"
PYPLN_TORCH_SEED = 0  # torch's seed at the start of each of its fits (PlnPCA's init is random: seeded_pyplnmodels)


def _pkg_resources_stand_in() -> types.ModuleType:
    """pyPLNmodels 1.0.x's data loaders import ``pkg_resources`` (gone from setuptools >= 81) for
    ``resource_stream`` alone: a module with that one function."""
    module = types.ModuleType("pkg_resources")

    def resource_stream(package: str, name: str):
        return open(os.path.join(os.path.dirname(sys.modules[package].__file__ or ""), name), "rb")

    module.__dict__["resource_stream"] = resource_stream
    return module


def import_pyplnmodels() -> Any:
    """``import pyPLNmodels``; where ``pkg_resources`` is missing, with a stand-in
    (:func:`_pkg_resources_stand_in`) in ``sys.modules`` only meanwhile: pyPLNmodels keeps its own
    reference, and no other package finds the stand-in afterwards."""
    if importlib.util.find_spec("pkg_resources") is not None or "pyPLNmodels" in sys.modules:
        return _import_quietly()
    sys.modules["pkg_resources"] = _pkg_resources_stand_in()
    try:
        return _import_quietly()
    finally:
        sys.modules.pop("pkg_resources", None)


def _import_quietly() -> Any:
    """``import pyPLNmodels`` without the warnings its first import compiles ("invalid escape sequence")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", SyntaxWarning)
        return importlib.import_module("pyPLNmodels")


def pyplnmodels_available() -> str | None:
    """None where pyPLNmodels imports, else the one-line reason with the install command."""
    try:
        import_pyplnmodels()
    except ImportError as e:
        missing = getattr(e, "name", None)
        what = "not installed" if missing in ("pyPLNmodels", "torch") else f"not importable ({e})"
        return f"{what} ({install_hint()})"
    except Exception as e:  # noqa: BLE001 - its import broke (another pandas, torch...): the sweep goes on
        return f"not importable ({first_line(e)}; {install_hint()} installs the version measured here)"
    return None


@contextlib.contextmanager
def quiet():
    """pyPLNmodels' progress bar and messages ("Fitting a Pln model ...", its end of fit) kept off
    the sweep's output, and torch's warning on NumPy arrays that are not writable."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def seeded_pyplnmodels(Y: np.ndarray, O: np.ndarray, X: np.ndarray, rank: int | None = None):
    """pyPLNmodels' model of the counts ``Y``, offsets ``O`` (n x p) and covariates ``X``, as the peer
    runs it: ``Pln`` (``rank`` None) or ``PlnPCA`` of rank ``rank``, ``add_const=False``; built
    quietly, to be fitted inside the ``with``. There torch's global RNG is seeded with
    :data:`PYPLN_TORCH_SEED` (PlnPCA's start draws from it: its coef's Poisson-regression start, its
    M), so that every fit starts alike; the caller's RNG state is left as it was. The one place a
    peer's model is built: :func:`pyplnmodels_fit` (a sweep's peer) and ``benchmarks/pca.py``."""
    import torch

    pp = import_pyplnmodels()
    with torch.random.fork_rng():
        torch.manual_seed(PYPLN_TORCH_SEED)
        with quiet():
            if rank is None:
                model = pp.Pln(Y, exog=X, offsets=O, add_const=False)
            else:
                model = pp.PlnPCA(Y, exog=X, offsets=O, rank=rank, add_const=False)
        yield model


def pyplnmodels_fit(
    data: Data, *, warmup: int = 1, repeats: int = 1, rank: int | None = None, **fit_kwargs
) -> FitResult:
    """pyPLNmodels' default fit (``fit_kwargs``: passed to its ``fit``, e.g. ``maxiter`` in tests)
    on ``data``: its counts, log offsets and covariates as they are (``add_const=False``: X holds
    the intercept). ``rank`` None: ``Pln`` (scored by :func:`score`, model profiled); ``rank`` q:
    ``PlnPCA(..., rank=q)`` (scored by :func:`score_plnpca`, model pca). Timed and scored as the
    module docstring says; the result is the last timed fit's (its fits are deterministic: the same
    start: torch seeded with :data:`PYPLN_TORCH_SEED` before each, as PlnPCA's start is drawn at
    random). A rank outside 1..p raises :class:`PeerError` before anything is imported;
    a fit whose counts pyPLNmodels changed (it drops all-zero columns) or whose ELBO is not finite
    raises :class:`PeerError`."""
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= data.p):
        raise PeerError(f"rank={rank!r}: allowed values are integers from 1 to p={data.p} (the data's variables)")
    import torch

    pp = import_pyplnmodels()

    # its own (n, p) float64 arrays: plnexp's may be float32 (large simulated counts) or a view of
    # one column (offsets one per row, plnexp.core.data.row_offsets); no copy when they are not
    Y, O = (np.ascontiguousarray(a, dtype=np.float64) for a in (data.Y, data.O))

    def one_fit():
        # each fit from the same seed (PlnPCA's start is random), so that its fits are deterministic as Pln's
        with seeded_pyplnmodels(Y, O, data.X, rank) as pln:
            if tuple(pln._endog.shape) != data.Y.shape:
                raise PeerError(
                    f"pyPLNmodels fitted counts of shape {tuple(pln._endog.shape)}, not the data's {data.Y.shape} "
                    "(it drops all-zero columns): not the same data"
                )
            with quiet():
                t0 = time.perf_counter()
                pln.fit(**fit_kwargs)
                return pln, time.perf_counter() - t0

    for _ in range(warmup):
        one_fit()
    fits = [one_fit() for _ in range(max(repeats, 1))]
    pln, runs_s = fits[-1][0], tuple(t for _, t in fits)
    own = np.asarray([float(e) for e in pln._elbo_criterion_monitor.elbo_list], dtype=np.float64)
    with torch.no_grad():
        own_final = float(pln.compute_elbo())  # at the final parameters (its list stops before the last update)
    if not (np.isfinite(own).all() and math.isfinite(own_final)):
        raise PeerError("pyPLNmodels' ELBO is not finite")
    if rank is None:
        loglik, params = score(
            data,
            pln.latent_mean.detach().cpu().double().numpy(),
            pln.latent_sqrt_variance.detach().cpu().double().numpy(),
        )
    else:
        loglik, params = score_plnpca(data.Y, data.O, data.X, pln)
    curve, shift = shifted_curve(own, own_final, loglik)
    return FitResult(
        elbo=curve,
        loglik=loglik,
        params=params,
        n_iter=len(own),
        timing=Timing.of_runs(runs_s, len(own), compile_s=0.0),
        model="profiled" if rank is None else PCA_NAME,
        strategy="pyplnmodels",
        optimizer="rprop",
        precision=str(pln._endog.dtype).removeprefix("torch."),
        device=pln._endog.device.type,
        extra={
            "final_elbo_jit": own_final + shift,  # its own final ELBO, shifted: loglik by construction
            "own_elbo_final": own_final,
            "elbo_shift": shift,
            "versions": {"pyPLNmodels": str(pp.__version__), "torch": str(torch.__version__)},
            "fit_kwargs": dict(fit_kwargs),
            "class": type(pln).__name__,
        },
    )


def pyplnmodels_versions() -> dict[str, str]:
    """pyPLNmodels' and torch's versions as installed (without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for tag, dist in (("pyplnmodels_version", "pyPLNmodels"), ("torch_version", "torch")):
        try:
            out[tag] = version(dist)
        except PackageNotFoundError:
            out[tag] = ""
    return out


def pyplnmodels_uses_gpu() -> bool:
    """pyPLNmodels puts its tensors on CUDA wherever torch sees it."""
    import torch

    return bool(torch.cuda.is_available())


# Pln's closed forms of B and Sigma make it plnexp's profiled model; it stands beside full too (same optimum)
_PLN = PeerFit("Pln", "Pln(Y, exog=X, offsets=O, add_const=False).fit()", "profiled")

PEERS: dict[str, Peer] = {
    "pyplnmodels": Peer(
        name="pyplnmodels",
        label="pyPLNmodels",
        pin=PYPLN_PIN,
        call=_PLN.call,
        available=pyplnmodels_available,
        fit=pyplnmodels_fit,
        versions=pyplnmodels_versions,
        uses_gpu=pyplnmodels_uses_gpu,
        model=_PLN.model,
        cls=_PLN.cls,
        # its default fit is the same for both classes: Rprop, lr 0.01, maxiter 400, tol 1e-6
        options={
            "tol": 1e-6,
            "optimizer": "torch.optim.Rprop(lr=0.01, step_sizes=(1e-10, 50))",
            "torch_seed": PYPLN_TORCH_SEED,
        },
        fits={
            "full": _PLN,
            "profiled": _PLN,
            PCA_NAME: PeerFit("PlnPCA", "PlnPCA(Y, exog=X, offsets=O, rank={rank}, add_const=False).fit()", PCA_NAME),
        },
    ),
}
