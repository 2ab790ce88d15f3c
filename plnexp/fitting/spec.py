"""What one fit is, resolved once into typed, frozen objects: :class:`FitSpec`.

The command line reaches it through :meth:`plnexp.jobs.config.Config.fit_spec`, Python users through
:func:`plnexp.fit`'s strings (:func:`parse`); :func:`plnexp.fitting.engine.run` takes nothing else. No name
is parsed again below this point. Also the device choice (:func:`resolve_device`), resolved where the
fit runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.device import DEVICES
from ..core.model import MODELS, PCA_NAME, Model, check_block_rows, pca_model
from ..core.optim import NEWTON, OptimizerSpec
from ..core.precision import PRECISIONS, Precision, precision as precision_named
from ..core.problem import GRADIENTS
from ..measure.timing import TimingSpec, check_counts
from ..strategies import StrategySpec, all_option_names

INITS = ("seed", "data", "random")
MODEL_NAMES = (*MODELS, PCA_NAME)
N_ITER_MAX = 2**31 - 1
"""The most iterations a fit runs (int32's maximum): every strategy returns its count of iterations
as an int32 (``jnp.asarray(n_iter, jnp.int32)``) and ``while_loop`` counts up to ``n_iter`` in an
int32; nothing is tighter (the ELBO curve has ``n_iter`` entries, and XLA's shapes are int64)."""


DEFAULT_N_ITER = 4000
"""The iterations of a fit that names none (``plnexp.fit``, ``run``'s ``n_iter``): enough for the
default optimizer from the data start to end within 1e-4 of the float64 optimum, with margin, on the
counts of docs/results.md, "Defaults that converge" (2000 x 200 at 90% zeros, the slowest there, first
within 1e-4 after ~2,300 and still 8.8e-5 away at 3,000). The timing study's sweeps name their own
(the tutorial's 1,000 and fewer). PLN-PCA's: :data:`PCA_DEFAULT_N_ITER`."""
DEFAULT_INIT = "data"
"""The initial state of a fit that names none (``init=None``), every model's: M from log(Y + 1) - O
(PLN-PCA's C and M from the data's top-q singular vectors), far nearer the optimum than the
tutorial's ``"seed"`` (M = 0, S = 1), which the timing study's sweeps name."""
PCA_DEFAULT_N_ITER = 1000
"""PLN-PCA's (:func:`default_n_iter`): its Newton rounds are at the float64 optimum within a few dozen
(docs/results.md, "Defaults that converge"); as before #63, so that its measured default calls stand."""


def default_n_iter(model: Model) -> int:
    """The iterations a fit of ``model`` runs when none is named (``n_iter=None``)."""
    return PCA_DEFAULT_N_ITER if model.name == PCA_NAME else DEFAULT_N_ITER


def default_optimizer(model: Model) -> str:
    """The optimizer a fit of ``model`` takes when none is named (``optimizer=None``): ``"newton"``
    for PLN-PCA (block Newton rounds, :func:`plnexp.core.model.pca_newton_step`: no learning rate,
    whatever the counts' density), ``"rprop"`` where its rows go in blocks (``block_rows``: the
    Newton step takes every row at once) and for the others: both reach the float64 optimum's
    neighbourhood and stay at their best there (docs/results.md, "Defaults that converge"), where the
    tutorial's ``radam_clip`` drifts off it."""
    return NEWTON if model.name == PCA_NAME and model.block_rows is None else "rprop"


def _model_for(model: Model, optimizer: str, gradient: str) -> Model:
    """``model`` as ``optimizer`` fits it: PLN-PCA's Newton variant for ``"newton"`` (one-line
    ValueError for another model, ``block_rows`` or ``gradient=autodiff``), the gradient one otherwise."""
    if optimizer == NEWTON:
        if model.name != PCA_NAME:
            raise ValueError(f"optimizer={NEWTON} with model={model.name}: only model={PCA_NAME} has it")
        if gradient != "analytic":
            raise ValueError(
                f"gradient={gradient!r} with optimizer={NEWTON}: its step is written out; allowed values are analytic"
            )
        return model if model.newton else pca_model(model.rank, model.block_rows, newton=True)
    return pca_model(model.rank, model.block_rows) if model.newton else model


def check_n_iter(value, key: str = "n_iter") -> int:
    """``n_iter``: an integer from 1 to :data:`N_ITER_MAX`; a one-line ValueError naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= N_ITER_MAX:
        raise ValueError(f"{key}={value!r}: allowed values are integers from 1 to {N_ITER_MAX}")
    return value


def check_rank(rank: int, p: int, key: str = "rank") -> None:
    """A PLN-PCA rank above the data's p: one-line ValueError naming ``key`` (``model.rank`` on the
    command line) and the allowed values."""
    if rank > p:
        raise ValueError(f"{key}={rank}: allowed values are integers from 1 to the data's p ({p})")


def model_named(name: str, rank: int | None = None, block_rows: int | None = None) -> Model:
    """The :class:`Model` of ``name`` (``rank``: pca's q, needed by pca only; ``block_rows``: pca's
    rows per block inside a step, None: every row at once); one-line ValueError naming ``model``,
    ``rank`` or ``block_rows`` and their allowed values."""
    if name not in MODEL_NAMES:
        raise ValueError(f"model={name!r}: allowed values are {', '.join(MODEL_NAMES)}")
    if name != PCA_NAME:
        for key, value in (("rank", rank), ("block_rows", block_rows)):
            if value is not None:
                raise ValueError(
                    f"{key}={value!r} with model={name}: only model={PCA_NAME} has a {key}; allowed values are None"
                )
        return MODELS[name]
    if rank is None:
        raise ValueError(f"rank=None: model={PCA_NAME} needs one; allowed values are integers from 1 to the data's p")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r}: allowed values are integers from 1 to the data's p")
    return pca_model(rank, check_block_rows(block_rows))


COMPILE_CACHE_VALUES = "true, false, null (auto: on for a fit, off in a sweep)"


def check_compile_cache(value, allowed: str = COMPILE_CACHE_VALUES):
    """``compile_cache``: True, False or None (auto); a one-line ValueError for anything else."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"compile_cache={value!r}: allowed values are {allowed}")
    return value


def cache_choice(
    compile_cache: bool | None, strategy: StrategySpec, directory: str | Path | None = None
) -> tuple[Path | None, bool]:
    """``compile_cache`` -> (the persistent compilation cache's folder or None: off, whether a second
    warm compile is timed). ``True``: the cache, both compiles timed (the timing study's switch);
    ``None`` (auto): the cache, one compile, served by it when an earlier process wrote the program
    (off for strategies JAX does not compile: the PyTorch baselines); ``False``: off. ``directory``:
    the cache's folder (default ``<outputs>/jax_cache``, :func:`plnexp.system.paths.outputs_dir`)."""
    if compile_cache is False or (compile_cache is None and not strategy.entry.jax_cache):
        return None, False
    from ..system.paths import outputs_dir

    folder = Path(directory) if directory is not None else outputs_dir() / "jax_cache"
    return folder, compile_cache is True


@dataclass(frozen=True)
class FitSpec:
    """One fit: the model, optimizer, strategy (with its options), precision, device, number of
    iterations, initialisation, gradient and timing protocol; ``replicates`` fits of it in one
    program (``vmap``), replicate k from seed ``seed + k``. Validated on construction; ``init=None``:
    the default (:data:`DEFAULT_INIT`: ``"data"``)."""

    model: Model
    optimizer: OptimizerSpec
    strategy: StrategySpec
    precision: Precision = PRECISIONS["float32"]
    device: str = "cpu"
    n_iter: int = None  # type: ignore[assignment]  # None: default_n_iter(model), set in __post_init__
    init: str = DEFAULT_INIT  # None (given): the default too, set in __post_init__
    gradient: str = "analytic"
    timing: TimingSpec = field(default_factory=TimingSpec)
    seed: int = 0
    replicates: int = 1

    def __post_init__(self):
        if self.n_iter is None:
            object.__setattr__(self, "n_iter", default_n_iter(self.model))  # frozen: set once, here
        check_n_iter(self.n_iter)
        if self.gradient in GRADIENTS:  # the model as the optimizer fits it (PLN-PCA's newton: its own step)
            object.__setattr__(self, "model", _model_for(self.model, self.optimizer.name, self.gradient))
        if self.init is None:
            object.__setattr__(self, "init", DEFAULT_INIT)  # frozen: set once, here
        check_counts(self, seed=0, replicates=1)
        if self.replicates > 1:
            self.strategy.check(replicates=self.replicates)
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r}: allowed values are {', '.join(INITS)}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient={self.gradient!r}: allowed values are {', '.join(GRADIENTS)}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r}: allowed values are {', '.join(DEVICES)}")


def parse(
    model: str = "profiled",
    optimizer: str | None = None,
    n_iter: int | None = None,
    precision: str = "float32",
    device: str = "cpu",
    strategy: str = "scan",
    *,
    lr: float | None = None,
    init: str | None = None,
    gradient: str = "analytic",
    repeats: int = 1,
    warmup: int = 0,
    first_call: bool = False,
    compile_cache: bool | None = None,
    compile_cache_dir: str | Path | None = None,
    time_budget_s: float = 0.0,
    seed: int = 0,
    replicates: int = 1,
    rank: int | None = None,
    block_rows: int | None = None,
    **options,
) -> FitSpec:
    """:func:`plnexp.fit`'s strings -> a :class:`FitSpec` (one-line ValueError on a bad choice).

    ``rank``: the q of ``model="pca"`` (and of no other model); ``block_rows``: its rows per block
    inside a step (None: every row at once; see docs/concepts/memory.md). ``init``: the initial state,
    one of :data:`INITS` (None: ``"data"``: :data:`DEFAULT_INIT`). ``n_iter``: None is the model's default (:func:`default_n_iter`: 4000, 1000 for pca).
    ``optimizer``: None is the model's default (:func:`default_optimizer`: ``"newton"`` for pca,
    ``"rprop"`` otherwise).
    ``options``: strategy options
    (``unroll``, ``tol``, ``patience``, ``mode``). Those of other strategies are ignored, so that
    one call can loop over strategies; a name no strategy has is an error."""
    the_model = model_named(model, rank, block_rows)
    if optimizer is None:
        optimizer = default_optimizer(the_model)
    prec = precision_named(precision)
    check_compile_cache(compile_cache, "True, False, None (auto: the cache on, one compile)")
    known = all_option_names()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"fit() got an unexpected keyword argument {unknown[0]!r} (strategy options are {', '.join(known)})"
        )
    spec = StrategySpec.of(strategy, **{k: v for k, v in options.items() if strategy in known[k]})
    spec.check(compile_cache, optimizer=optimizer, gradient=gradient, model=model)
    cache_dir, warm = cache_choice(compile_cache, spec, compile_cache_dir)
    return FitSpec(
        the_model,
        OptimizerSpec(optimizer, lr),
        spec,
        prec,
        device,
        default_n_iter(the_model) if n_iter is None else n_iter,
        DEFAULT_INIT if init is None else init,
        gradient,
        TimingSpec(repeats, warmup, first_call, cache_dir, time_budget_s, warm),
        seed,
        replicates,
    )
