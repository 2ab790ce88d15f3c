"""plnexp.measure.fingerprint: the same XLA program gets the same fingerprint whatever its names and source
lines; another program gets another. And which strategies compile to one program (on oaks, d=1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from plnexp.measure import fingerprint
from plnexp import strategies
from plnexp.fitting.engine import make_problem
from plnexp.core.initial_state import init_state
from plnexp.fitting.spec import parse


def _exe(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def test_names_and_source_lines_do_not_change_the_fingerprint():
    x = jnp.ones((8, 3))

    def first(a):
        return jnp.tanh(a @ a.T).sum()

    def second_name(b):  # the same maths, written elsewhere, under another name

        return jnp.tanh(b @ b.T).sum()

    def other(a):
        return jnp.sin(a @ a.T).sum()

    f1, f2, f3 = (fingerprint.of_executables({"f": _exe(f, x)}) for f in (first, second_name, other))
    assert f1 == f2 != f3
    assert len(f1) == 12
    # the raw texts differ (module name, metadata), the canonical ones do not
    t1, t2 = _exe(first, x).as_text(), _exe(second_name, x).as_text()
    assert t1 != t2 and fingerprint.canonical(t1) == fingerprint.canonical(t2)


def test_several_functions_are_fingerprinted_as_a_set():
    x = jnp.ones(4)
    a, b = _exe(jnp.sin, x), _exe(jnp.cos, x)
    assert fingerprint.of_executables({"a": a, "b": b}) == fingerprint.of_executables({"x": b, "y": a})
    assert fingerprint.of_executables({"a": a, "b": b}) != fingerprint.of_executables({"a": a})
    assert fingerprint.of_executables({}) == ""


def _program_prints(data, names, n_iter=5):
    out = {}
    for name in names:
        spec = parse("full", "radam_clip", n_iter, "float32", "cpu", name)
        problem = make_problem(spec.model, spec.optimizer, spec.gradient)
        program = strategies.build(problem, n_iter, spec.strategy)
        arrays = program.place([data], np.float32, jax.devices("cpu")[0])
        state = problem.init(init_state(problem.model, arrays, "seed"))
        out[name] = fingerprint.of_executables(program.compile(state, arrays).executables)
    return out


@pytest.mark.slow
def test_carry_containers_share_one_program_on_oaks(oaks):
    """NamedTuple, registered pytree class and dataclass carries flatten to their leaves in one
    order: one XLA program. The dict carry of `scan` orders its leaves by key, which permutes the
    loop's tuple: the same operations, another program text. The unrolled scan, fori_loop,
    while_loop and jit_per_function compile other programs; eager has none."""
    prints = _program_prints(
        oaks,
        [
            "scan_namedtuple",
            "scan_pytree",
            "scan_dataclass",
            "scan",
            "scan_unrolled",
            "fori_loop",
            "while_loop",
            "jit_per_function",
            "eager",
        ],
    )
    assert prints["scan_namedtuple"] == prints["scan_pytree"] == prints["scan_dataclass"] != ""
    distinct = {
        prints[k] for k in ("scan_namedtuple", "scan", "scan_unrolled", "fori_loop", "while_loop", "jit_per_function")
    }
    assert len(distinct) == 6
    assert prints["eager"] == ""


@pytest.mark.parametrize("precision", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_a_fit_logs_its_program_fingerprint(oaks, precision):
    import plnexp

    with jax.enable_x64(precision == "float64"):
        a = plnexp.fit(oaks, n_iter=3, strategy="scan_pytree", precision=precision, model="full")
        b = plnexp.fit(oaks, n_iter=3, strategy="scan_dataclass", precision=precision, model="full")
    assert a.timing.fingerprint == b.timing.fingerprint != ""
