"""plnexp: Poisson log-normal fits in JAX under several JIT strategies, measured.

```python
import plnexp

data = plnexp.load_oaks(replication=100)
res = plnexp.fit(data, model="full", optimizer="radam_clip", n_iter=1000)
res = plnexp.fit(counts)  # counts in memory: a NumPy array or a pandas DataFrame (plnexp.as_data)
```

Importing plnexp changes nothing in the process (no environment variable, no JAX setting). Its
process settings (XLA flags, LAPACK threads: :mod:`plnexp.system.runtime`) are applied by the command line,
by :func:`plnexp.fit` while JAX has not started yet, or by ``plnexp.runtime.configure()``.
"""

from .system import runtime
from .core.data import Data, DataError, as_data, load_anndata, load_csv, load_oaks, replicate, simulate, simulate_pca
from .fitting.engine import FitResult, NumericsError, fit, fit_replicates
from .strategies import STRATEGIES

__all__ = [
    "Data",
    "DataError",
    "FitResult",
    "NumericsError",
    "STRATEGIES",
    "as_data",
    "fit",
    "fit_replicates",
    "load_anndata",
    "load_csv",
    "load_oaks",
    "replicate",
    "runtime",
    "simulate",
    "simulate_pca",
]
__version__ = "0.1.0"
