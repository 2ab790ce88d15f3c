"""XLA's memory analysis of a fit's compiled code at any size, compiled from shapes alone.

:func:`measure` lowers and compiles three functions of one fit from ``jax.ShapeDtypeStruct``
arguments (nothing of size n x p is allocated, so a 60,000 x 20,000 fit is measured on any
machine): the model's value and gradient (``gradient=analytic``: the hand-written one;
``autodiff``: ``jax.value_and_grad`` of its ELBO), one whole step (value, gradient, optimizer update,
closed forms) and the whole fit as ``strategy`` compiles it (its loop of ``n_iter`` steps and the
final ELBO). The offsets are one per row by default (``offsets="row"``: O is the (n, 1) column a
fit's device gets, as for ``simulate_pca``, ``load_anndata``'s library size or ``as_data(counts,
offsets=(n,) totals)``); ``offsets="full"``: an (n, p) O (offsets given per entry). Each gives
``compiled.memory_analysis()``'s argument, output, alias and temp bytes;
:func:`report` writes them in units of one n x p array of the fit's dtype (and of one b x p array
when the rows go in blocks of b). docs/concepts/memory.md reads them:

    .venv/bin/python -m plnexp.fitting.memory --n 20000 --p 1000 --rank 5
    .venv/bin/python -m plnexp.fitting.memory --n 20000 --p 1000 --rank 5 --block-rows 1000
    .venv/bin/python -m plnexp.fitting.memory --n 60000 --p 20000 --rank 5 --block-rows 2000 --what step

The numbers are for the backend JAX runs on (CPU here), with plnexp's XLA flags
(:mod:`plnexp.system.runtime`, set when JAX has not started yet, as a fit does).
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

WHAT = ("value_and_grad", "step", "fit")
OFFSETS = ("row", "full")  # O on the device: the (n, 1) column of offsets one per row, or (n, p)
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")


@dataclass(frozen=True)
class Memory:
    """One compiled function's memory analysis (bytes), and the sizes they are read against."""

    argument: int
    output: int
    alias: int
    temp: int
    n: int
    p: int
    itemsize: int
    block_rows: int | None = None

    @property
    def peak(self) -> int:
        """argument + output + temp - alias: what the function holds while it runs (XLA's count)."""
        return self.argument + self.output + self.temp - self.alias

    def in_arrays(self, nbytes: int, rows: int | None = None) -> float:
        """``nbytes`` in units of one ``rows`` x p array (default: n x p) of the fit's dtype."""
        return nbytes / ((self.n if rows is None else rows) * self.p * self.itemsize)


def _shapes(model, n: int, p: int, d: int, dtype, offsets: str = "row"):
    """(params, state, arrays) of a fit of ``model`` as ShapeDtypeStructs: nothing is allocated.
    ``offsets``: O's shape, (n, 1) for ``"row"`` (as :meth:`plnexp.core.data.Data.to_device` places
    offsets one per row), (n, p) for ``"full"``."""
    import jax
    from jax import ShapeDtypeStruct as Shape

    from ..core.arrays import Arrays

    # shapes where Arrays types arrays: jit lowers either alike
    o_shape = (n, 1) if offsets == "row" else (n, p)
    shapes: list[Any] = [Shape((n, p), dtype), Shape(o_shape, dtype), Shape((n, d), dtype), Shape((), dtype)]
    arrays = Arrays(*shapes)
    latent = model.rank or p
    params = {"B": Shape((d, p), dtype), "M": Shape((n, latent), dtype), "S": Shape((n, latent), dtype)}
    if model.rank:
        params["C"] = Shape((p, model.rank), dtype)
        params["R"] = Shape((model.rank, model.rank), dtype)
    elif model.name == "profiled":
        del params["B"]
    state = jax.eval_shape(model.complete, params, arrays)
    return model.free(state), state, arrays


def measure(
    n: int,
    p: int,
    d: int = 1,
    *,
    model: str = "pca",
    rank: int | None = 5,
    block_rows: int | None = None,
    precision: str = "float32",
    optimizer: str = "rprop",
    gradient: str = "analytic",
    strategy: str = "scan",
    n_iter: int = 10,
    what: tuple[str, ...] = WHAT,
    offsets: str = "row",
) -> dict[str, Memory]:
    """XLA's memory analysis of ``what`` (:data:`WHAT`) for a fit of this size and choices (as
    :func:`plnexp.fit` takes them; ``rank`` and ``block_rows`` for ``model="pca"`` only), compiled
    from shapes on JAX's default device. ``fit``: the whole program of ``strategy`` (one whose fit
    is one compiled function: scan and its carries, fori_loop, while_loop). ``offsets``
    (:data:`OFFSETS`): O as the (n, 1) column of offsets one per row, or a full (n, p) array."""
    from ..system import runtime

    runtime.configure_or_warn()  # the fit's XLA flags, where JAX has not started yet
    import jax

    from .. import strategies
    from .engine import make_problem
    from .spec import parse

    unknown = sorted(set(what) - set(WHAT))
    if unknown:
        raise ValueError(f"what={unknown[0]!r}: allowed values are {', '.join(WHAT)}")
    if offsets not in OFFSETS:
        raise ValueError(f"offsets={offsets!r}: allowed values are {', '.join(OFFSETS)}")
    spec = parse(
        model,
        optimizer,
        n_iter,
        precision,
        "cpu",
        strategy,
        rank=rank if model == "pca" else None,
        block_rows=block_rows,
        gradient=gradient,
        compile_cache=False,
    )
    dtype = spec.precision.dtype
    problem = make_problem(spec.model, spec.optimizer, spec.gradient)
    out: dict[str, Memory] = {}
    with jax.enable_x64(dtype == np.float64):
        params, state, arrays = _shapes(spec.model, n, p, d, dtype, offsets)
        fit_state = jax.eval_shape(problem.init, state)
        functions = {
            "value_and_grad": (jax.jit(problem.loss_and_grad), (params, state, arrays)),
            "step": (jax.jit(problem.step), (fit_state, arrays)),
        }
        if "fit" in what:
            program = strategies.make(problem, n_iter, spec.strategy)
            jitted = getattr(program, "_jitted", None)
            if jitted is None:
                raise ValueError(f"strategy={strategy}: its fit is not one compiled function; use scan, fori_loop")
            functions["fit"] = (jitted, (fit_state, arrays))
        for name in what:
            function, args = functions[name]
            analysis = function.lower(*args).compile().memory_analysis()
            argument, output, alias, temp = (int(getattr(analysis, f)) for f in FIELDS)
            itemsize = np.dtype(dtype).itemsize
            out[name] = Memory(argument, output, alias, temp, n, p, itemsize, spec.model.block_rows)
    return out


def report(found: dict[str, Memory]) -> list[str]:
    """One line per function: temp, arguments, output, alias and peak in n x p arrays (and b x p
    arrays for temp, with blocks), and the peak in MB."""
    lines = []
    for name, m in found.items():
        blocks = f" = {m.in_arrays(m.temp, m.block_rows):5.2f} b x p" if m.block_rows else ""
        lines.append(
            f"{name:15s} temp {m.in_arrays(m.temp):7.3f} n x p{blocks}   arguments {m.in_arrays(m.argument):6.3f}"
            f"   output {m.in_arrays(m.output):6.3f}   alias {m.in_arrays(m.alias):6.3f}"
            f"   peak {m.in_arrays(m.peak):6.3f} n x p = {m.peak / 1e6:,.1f} MB"
        )
    return lines


# the command line's help beside measure's own arguments, which it takes as --name (its defaults too)
HELP = {
    "rank": "pca's q",
    "block_rows": "pca's rows per block (default: none)",
    "what": f"comma-separated, of {', '.join(WHAT)}",
    "offsets": "O on the device: row, the (n, 1) column; full, (n, p)",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plnexp.fitting.memory", description=__doc__.split("\n\n")[0])
    for name, param in inspect.signature(measure).parameters.items():
        default = {"n": 20000, "p": 1000, "what": ",".join(WHAT)}.get(name, param.default)
        kind = str if isinstance(default, str) else int
        choices = OFFSETS if name == "offsets" else None
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=default, choices=choices, help=HELP.get(name))
    a = parser.parse_args(argv)
    found = measure(**{**vars(a), "what": tuple(w for w in a.what.split(",") if w)})
    blocks = f", block_rows={a.block_rows}" if a.block_rows else ""
    print(
        f"# {a.model} n={a.n} p={a.p} d={a.d}{f' q={a.rank}' if a.model == 'pca' else ''}{blocks} {a.precision}"
        f" {a.optimizer} gradient={a.gradient} strategy={a.strategy} offsets={a.offsets}: one n x p array = "
        f"{a.n * a.p * np.dtype(a.precision).itemsize / 1e6:,.1f} MB"
    )
    print("\n".join(report(found)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
