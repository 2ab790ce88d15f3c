"""plnexp: Poisson log-normal fits in JAX under several JIT strategies, measured.

```python
import plnexp

data = plnexp.load_oaks(replication=100)
res = plnexp.fit(data, model="full", optimizer="radam_clip", n_iter=1000)
res = plnexp.fit(counts)  # counts in memory: a NumPy array or a pandas DataFrame (plnexp.as_data)
res.save("my_fit"); res = plnexp.load_fit("my_fit")  # or load_fit("runs:/RUN_ID"): a run's model
```

Importing plnexp changes nothing in the process (no environment variable, no JAX setting). Its
process settings (XLA flags, LAPACK threads: :mod:`plnexp.system.runtime`) are applied by the command line,
by :func:`plnexp.fit` while JAX has not started yet, or by ``plnexp.runtime.configure()``.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from .system import runtime
from .system.version import VERSION

if TYPE_CHECKING:  # the names as the documentation and type checkers see them
    from .core.anndata_counts import load_anndata
    from .core.csv_files import load_csv
    from .core.data import Data, DataError
    from .core.data_rows import replicate
    from .core.inputs import as_data
    from .core.oaks import load_oaks
    from .core.simulation import simulate, simulate_pca
    from .fitting.engine import FitResult, NumericsError, fit, fit_replicates
    from .fitting.saved import FitFileError
    from .strategies import STRATEGIES

# the public names, imported when first used (PEP 562): ``python -m plnexp --help`` and the commands
# that fit nothing never import JAX
_WHERE = {
    "load_anndata": ".core.anndata_counts",
    "load_csv": ".core.csv_files",
    "Data": ".core.data",
    "DataError": ".core.data",
    "replicate": ".core.data_rows",
    "as_data": ".core.inputs",
    "load_oaks": ".core.oaks",
    "simulate": ".core.simulation",
    "simulate_pca": ".core.simulation",
    "FitResult": ".fitting.engine",
    "NumericsError": ".fitting.engine",
    "fit": ".fitting.engine",
    "fit_replicates": ".fitting.engine",
    "FitFileError": ".fitting.saved",
    "STRATEGIES": ".strategies",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


def load_fit(source) -> "FitResult":
    """A saved fit: the folder :meth:`FitResult.save` wrote, or ``"runs:/RUN_ID"``, the fitted model a
    run logged (the store of ``$MLFLOW_TRACKING_URI``, else plnexp's local one under the outputs
    folder). See docs/how-to/use-a-fitted-model.md."""
    from .store.fitted import load_fit as load

    return load(source)


__all__ = [
    "Data",
    "DataError",
    "FitFileError",
    "FitResult",
    "NumericsError",
    "STRATEGIES",
    "as_data",
    "fit",
    "fit_replicates",
    "load_anndata",
    "load_csv",
    "load_fit",
    "load_oaks",
    "replicate",
    "runtime",
    "simulate",
    "simulate_pca",
]
__version__ = VERSION
