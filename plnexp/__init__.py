"""plnexp: Poisson log-normal fits in JAX under several JIT strategies, measured.

import plnexp
data = plnexp.load_oaks(replication=100)
res = plnexp.fit(data, model="full", optimizer="radam_clip", n_iter=1000)
"""

from . import runtime

runtime.set_xla_flags()  # must run before JAX creates its CPU client: see plnexp/runtime.py
runtime.set_lapack_threads(1)  # SciPy's OpenBLAS (jaxlib's CPU LAPACK): see plnexp/runtime.py

from .data import Data, DataError, load_csv, load_oaks, replicate, simulate  # noqa: E402 - after the process settings above
from .fitting import FitResult, NumericsError, fit, fit_replicates  # noqa: E402 - after the process settings above
from .strategies import STRATEGIES  # noqa: E402 - after the process settings above

__all__ = [
    "Data",
    "DataError",
    "FitResult",
    "NumericsError",
    "STRATEGIES",
    "fit",
    "fit_replicates",
    "load_csv",
    "load_oaks",
    "replicate",
    "simulate",
]
__version__ = "0.1.0"
