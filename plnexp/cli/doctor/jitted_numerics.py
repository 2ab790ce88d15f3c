"""The doctor's numerics: on every JAX device, for each model (full, profiled, and pca at rank
:data:`PCA_RANK`) and precision, the jitted partial ELBO (``model.state_elbo`` and the value of
``model.value_and_grad``) at a seeded random point on the shipped oaks data against the float64 host
reference (:mod:`plnexp.core.reference`) at the precision's tolerance
(:meth:`plnexp.core.precision.Precision.check_tolerance`), plus the reduction that jaxlib 0.10.2's CPU
backend is known to miscompile without plnexp's XLA flag (:func:`stirling_probe`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np

from ...core import reference
from ...core.arrays import Arrays
from ...core.model import MODELS, PCA_NAME, Model, pca_model
from ...core.pln_elbo import PLNState
from ...core.precision import PRECISIONS
from .check import Check
from .machine import all_devices, device_label, x64_works

# jaxlib 0.10.2 returns 1113766.9 instead of 1285968.25 for this sum on x86 CPUs (plnexp/system/runtime.py);
# float32 rounding alone stays below 1e-6 (tests/test_model.py uses the same 2e-5).
PROBE_RTOL = 2e-5
SEED = 0
PCA_RANK = 2  # the rank of the PLN-PCA whose ELBO is checked (oaks: p = 114)


def jitted_state_elbo(model: Model, state: PLNState, arrays: Arrays):
    import jax

    return jax.jit(model.state_elbo)(state, arrays)


def jitted_value_and_grad(model: Model, state: PLNState, arrays: Arrays):
    import jax

    return jax.jit(model.value_and_grad)(model.free(state), state, arrays)[0]


# (label, function(model, complete state, arrays) -> partial ELBO): what every fit compiles
JITTED: tuple[tuple[str, Callable], ...] = (
    ("state_elbo", jitted_state_elbo),
    ("value_and_grad", jitted_value_and_grad),
)


def checked_models() -> tuple[Model, ...]:
    """The models whose ELBO the doctor checks: every one of :data:`MODELS`, and PLN-PCA at rank
    :data:`PCA_RANK`."""
    return (*MODELS.values(), pca_model(PCA_RANK))


def random_params(model: Model, data, seed: int = SEED) -> dict:
    """A seeded point near a plausible fit (the ``data`` init plus noise), as float64 numpy arrays.
    PLN-PCA: C and M from the top ``model.rank`` singular vectors of the residual of Z on X (as its
    ``data`` init), plus noise, and a rotation R that is not 0 (the ELBO sees C Q and M Q)."""
    rng = np.random.default_rng(seed)
    n, p = data.Y.shape
    Z = np.log1p(data.Y) - data.O - 0.3 + 0.3 * rng.normal(size=(n, p))
    S = rng.uniform(0.2, 1.0, size=(n, p))
    if model.name == "profiled":
        return {"M": Z, "S": S}
    B = np.linalg.lstsq(data.X, Z, rcond=None)[0] + 0.2 * rng.normal(size=(data.X.shape[1], p))
    if model.name == PCA_NAME:
        q = model.rank
        U, s, Vt = np.linalg.svd(Z - data.X @ B, full_matrices=False)
        return {
            "B": B,
            "C": Vt[:q].T * (s[:q] / np.sqrt(n)) + 0.05 * rng.normal(size=(p, q)),
            "M": U[:, :q] * np.sqrt(n) + 0.3 * rng.normal(size=(n, q)),
            "S": S[:, :q],
            "R": 0.3 * rng.normal(size=(q, q)),
        }
    return {"B": B, "M": Z - data.X @ B, "S": S}


def elbo_check(
    model: Model,
    device,
    precision: str,
    data,
    functions: Iterable[tuple[str, Callable]] = JITTED,
    seed: int = SEED,
) -> Check:
    """Each jitted ELBO of ``functions`` at a random complete state vs the float64 host reference
    (``model.host_reference`` at ``model.params`` of the state copied to the host in float64:
    :func:`plnexp.core.reference.elbo`; PLN-PCA: :func:`plnexp.core.reference.pca_elbo` at the C and M
    the ELBO sees, rotated by the state's R)."""
    import jax

    prec = PRECISIONS[precision]
    dtype = prec.dtype
    name = f"elbo[{model.name},{precision},{device_label(device)}]"
    rank = f" (rank {model.rank})" if model.name == PCA_NAME else ""
    where = f"model {model.name}{rank} on {device_label(device)} in {precision}"
    with jax.enable_x64(dtype == np.float64):
        arrays = data.to_device(dtype, device)
        params = {k: jax.device_put(np.asarray(v, dtype), device) for k, v in random_params(model, data, seed).items()}
        state = jax.jit(model.complete)(params, arrays)
        jitted = [(label, float(fn(model, state, arrays))) for label, fn in functions]
    host_state = PLNState._make(np.asarray(a, np.float64) for a in state)  # float64 copies on the host
    host, _ = model.host_reference(model.params(host_state, data), data)  # by NumPy in float64
    log_fact = reference.log_factorial_sum(data.Y)
    rtol = prec.check_rtol
    tol = prec.check_tolerance(host, data.Y.size)
    for label, value in jitted:
        value -= log_fact
        rel = abs(value - host) / abs(host) if np.isfinite(value) and np.isfinite(host) else float("nan")
        if not abs(value - host) <= tol:  # NaN fails too
            return Check(
                name,
                False,
                f"jitted {label} gives {value:.6f} but the float64 host reference gives "
                f"{host:.6f} (relative error {rel:.2e}, beyond {rtol:g} relative and the "
                f"absolute floor of {data.Y.size} entries) for {where}",
            )
    worst = max(abs(v - log_fact - host) / abs(host) for _, v in jitted) if jitted else 0.0
    return Check(
        name,
        True,
        f"{', '.join(label for label, _ in jitted)} = {host:.4f} within {worst:.1e} "
        f"(<= {rtol:g}) of the float64 host reference",
    )


def stirling_probe(device, data, jitted: Callable | None = None) -> Check:
    """The jitted Stirling sum over oaks counts (float32) that jaxlib 0.10.2 miscompiles, vs numpy float64."""
    import jax
    import jax.numpy as jnp

    k = np.where(data.Y == 0, 1.0, data.Y)
    want = float(np.sum(np.log(np.sqrt(2 * np.pi * k)) + k * np.log(k / np.e)))
    if jitted is None:
        jitted = jax.jit(lambda k: jnp.sum(jnp.log(jnp.sqrt(2 * jnp.pi * k)) + k * jnp.log(k / jnp.e)))
    got = float(jitted(jax.device_put(k.astype(np.float32), device)))
    rel = abs(got - want) / abs(want)
    name = f"miscompile_probe[{device_label(device)}]"
    if not rel <= PROBE_RTOL:
        return Check(
            name,
            False,
            f"jitted Stirling sum over oaks counts gives {got:.1f} but numpy float64 gives "
            f"{want:.1f} (relative error {rel:.2e} > {PROBE_RTOL:g}): this XLA miscompiles "
            f"a fused reduction on {device_label(device)}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
        )
    return Check(name, True, f"jitted Stirling sum {got:.1f} within {rel:.1e} of numpy float64 {want:.1f}")


def numerics() -> list[Check]:
    from ... import load_oaks

    data = load_oaks()
    precisions = ["float32"] + (["float64"] if x64_works() else [])
    out = []
    for device in all_devices():
        out.append(stirling_probe(device, data))
        out += [elbo_check(model, device, precision, data) for model in checked_models() for precision in precisions]
    return out
