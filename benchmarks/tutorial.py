"""The seed tutorial's level-2 fit (``jaxfit2``: the whole loop in one ``lax.scan``), reproduced as
its users run it, defects included, as the reference the benchmarks compare against.

Copied from the tutorial (shared/seeds/jit-example-pln-jax.txt) with only what our copy cut off
restored: the optimizer chain ``optax.chain(optax.scale_by_radam(), optax.scale(-1.0),
optax.clip(0.1))`` and the ``lax.scan`` call. Its ELBO keeps the tutorial's operator-precedence
bug (Omega left off M'M), ``det``/``inv`` and the Stirling log-factorial inside the loop: the
point is to time the code people copy, not to fix it (plnexp's own step is the fixed one).

    fit, args = make_fit(Y, O, X, n_iter=1000)     # numpy arrays in, float32
    compiled = jax.jit(fit).lower(*args).compile()
    elbo = jax.block_until_ready(compiled(*args))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def _log_stirling(integer):
    integer_ = integer + (integer == 0)
    return jnp.log(jnp.sqrt(2 * jnp.pi * integer_)) + integer_ * jnp.log(integer_ / jnp.exp(1))


def get_ELBO(optim_params, other_params):  # the tutorial's name
    B, M, S = optim_params["B"], optim_params["M"], optim_params["S"]
    X, O, n, Omega, Y, p = (
        other_params["X"],
        other_params["O"],
        other_params["n"],
        other_params["Omega"],
        other_params["Y"],
        other_params["p"],
    )
    S2 = jnp.square(S)
    XB = X @ B
    A = jnp.exp(O + M + XB + S2 / 2)
    elbo = n / 2 * jnp.log(jnp.linalg.det(Omega))
    elbo += jnp.sum(-A + Y * (O + M + XB) + 0.5 * jnp.log(S2))
    elbo -= 0.5 * jnp.trace(M.T @ M + jnp.diag(jnp.sum(S2, axis=0)) @ Omega)
    elbo += 0.5 * n * p - jnp.sum(_log_stirling(Y))
    return -elbo


def get_Sigma(n, M, S):
    return 1 / n * (M.T @ M + jnp.diag(jnp.sum(S**2, axis=0)))


def jaxfit2(optim_params, other_params, N_iter):
    optimizer = optax.chain(optax.scale_by_radam(), optax.scale(-1.0), optax.clip(0.1))
    opt_state = optimizer.init(optim_params)

    def scan_fun(carry, _):
        optim_params = carry["optim_params"]
        other_params = carry["other_params"]
        loss_value, grads = jax.value_and_grad(get_ELBO)(optim_params, other_params)
        updates, opt_state = optimizer.update(grads, carry["opt_state"])
        optim_params = optax.apply_updates(optim_params, updates)
        other_params["Sigma"] = get_Sigma(other_params["n"], optim_params["M"], optim_params["S"])
        other_params["Omega"] = jnp.linalg.inv(other_params["Sigma"])
        carry["optim_params"] = optim_params
        carry["other_params"] = other_params
        carry["opt_state"] = opt_state
        return carry, loss_value

    carry, ELBO = jax.lax.scan(
        scan_fun,
        {"optim_params": optim_params, "other_params": other_params, "opt_state": opt_state},
        None,
        length=N_iter,
    )
    return ELBO


def make_fit(Y, O, X, n_iter: int = 1000):
    """(fit, args): ``fit(*args)`` runs the tutorial's scan for ``n_iter`` iterations, float32,
    from its initial point (M=0, S=1, B=0, Sigma=Omega=I); returns the negative-ELBO curve."""
    Y, O, X = (jnp.asarray(np.asarray(a, np.float32)) for a in (Y, O, X))
    n, p = Y.shape
    d = X.shape[1]
    optim_params = {"B": jnp.zeros((d, p)), "M": jnp.zeros((n, p)), "S": jnp.ones((n, p))}
    other_params = {
        "X": X,
        "O": O,
        "Y": Y,
        "Omega": jnp.eye(p),
        "Sigma": jnp.eye(p),
        "n": jnp.asarray(n, jnp.float32),
        "p": jnp.asarray(p, jnp.float32),
    }

    def fit(optim_params, other_params):
        return jaxfit2(optim_params, other_params, n_iter)

    return fit, (optim_params, other_params)


def main(argv=None) -> int:
    """Time the tutorial's scan in a plain process (no plnexp import: no plnexp XLA flags, SciPy's
    OpenBLAS at its default thread count): how its users run it. Prints one JSON line."""
    import argparse
    import json
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--n-iter", type=int, default=1000)
    ap.add_argument("--replication", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    oaks = Path(__file__).resolve().parent.parent / "plnexp" / "datasets" / "oaks"
    Y = np.loadtxt(oaks / "counts.csv", delimiter=",", skiprows=1)
    O = np.log(np.loadtxt(oaks / "offsets.csv", delimiter=",", skiprows=1))
    Y, O = (np.repeat(a, args.replication, axis=0) for a in (Y, O))
    fit, fit_args = make_fit(Y, O, np.ones((Y.shape[0], 1)), args.n_iter)
    t0 = time.perf_counter()
    compiled = jax.jit(fit).lower(*fit_args).compile()
    compile_s = time.perf_counter() - t0
    runs = []
    for _ in range(args.repeats + 1):  # the first run is a warm-up
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*fit_args))
        runs.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "compile_s": compile_s,
                "runs_s": runs[1:],
                "n": Y.shape[0],
                "p": Y.shape[1],
                "xla_flags": __import__("os").environ.get("XLA_FLAGS", ""),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
