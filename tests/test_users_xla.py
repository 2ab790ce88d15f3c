"""The compiled numerics at the users' XLA settings.

The suite compiles its fused kernels with XLA's classic emitters and LLVM at -O0
(``conftest.TEST_XLA_FLAGS``: ~8x faster compiles in all). Users compile with XLA's fusion emitters
at its default level, where LLVM vectorises and fuses multiply-adds: the same HLO, other machine
code. This test fits, in a process whose ``XLA_FLAGS`` lack the suite's flags, each model (full, profiled, PLN-PCA of rank 2) in both precisions on simulated
data with d = 2 covariates or on oaks (d = 1), each model on both and each precision on both: 6
fits, the JAX loop strategies whose programs differ from scan's (the carries compile to scan's
program, ``test_fingerprint``) taking turns.
Each fit checks its compiled ELBO against the float64 host reference at its first and last
iteration (``plnexp.fitting.engine.check_against_host``: a ``NumericsError`` fails it); here each curve
must also equal scan's fit of the same case compiled with the suite's flags in this process, at the tolerances
of test_strategies.py (the two levels sum in other orders: float64 1e-9, float32 1e-5), and the
float64 final ELBOs of the full and profiled fits the independent NumPy reference
(tests/reference_np.py) to 1e-9.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import TEST_XLA_FLAGS

import plnexp

TESTS = Path(__file__).parent
RTOL = {"float64": 1e-9, "float32": 1e-5}  # test_strategies.py's curve tolerances
OPTIMIZER = {"float64": "radam_clip", "float32": "adam"}  # as test_strategies.py (see its docstring)
LR = {"radam_clip": None, "adam": 1e-2}
STRATEGIES = ("scan", "fori_loop", "while_loop", "scan_unrolled", "jit_per_function")
MODELS = (("full", None), ("profiled", None), ("pca", 2))
N_ITER = 30


def _cases():
    """Each (model, precision) once, on the two data sets in turn (each model sees both, as does each
    precision), the strategies taking turns: 6 fits."""
    cases = [(m, r, p) for m, r in MODELS for p in ("float64", "float32")]
    return [
        (("small", "oaks")[(i + i // 2) % 2], m, r, p, STRATEGIES[i % len(STRATEGIES)])
        for i, (m, r, p) in enumerate(cases)
    ]


def _datas():
    return {"small": plnexp.simulate(n=60, p=8, d=2, seed=1), "oaks": plnexp.load_oaks()}


def _fit(datas, data, model, rank, precision, strategy):
    # pca: adam in both precisions; radam_clip's clipped steps follow rounding where the gradient of the
    # latent axes' rotation crosses 0 (see tests/test_pca.py's KW)
    optimizer = "adam" if model == "pca" else OPTIMIZER[precision]
    return plnexp.fit(
        datas[data],
        model=model,
        rank=rank,
        optimizer=optimizer,
        lr=LR[optimizer],
        n_iter=N_ITER,
        precision=precision,
        strategy=strategy,
        init="seed",  # pca's default start is the data's: from it, float64 fits of two strategies part by ~2e-9 in 20 steps
        timed=False,
        **({"tol": 0.0} if strategy == "while_loop" else {}),
    )


_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import reference_np
    import test_users_xla as t
    out = {{"flags": os.environ.get("XLA_FLAGS", ""), "fits": []}}
    datas = t._datas()
    for data, model, rank, precision, strategy in t._cases():
        r = t._fit(datas, data, model, rank, precision, strategy)
        fit = {{"elbo": [float(e) for e in r.elbo], "loglik": r.loglik}}
        if model != "pca":
            d, p = datas[data], r.params
            fit["numpy"] = reference_np.elbo_np(d.Y, d.O, d.X, p["B"], p["M"], p["S"], p["Sigma"])
        out["fits"].append(fit)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_model_and_precision_at_the_users_xla_settings_equals_scan_at_the_suites_and_the_reference():
    env = dict(os.environ, PLNEXP_TEST_XLA_OPT="default")
    names = {f.split("=", 1)[0] for f in TEST_XLA_FLAGS}  # by name, as conftest adds them: a user's value too
    env["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=", 1)[0] not in names)
    script = _SCRIPT.format(tests=str(TESTS))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(f.split("=")[0] in out["flags"] for f in TEST_XLA_FLAGS), out["flags"]
    cases = _cases()
    assert len(out["fits"]) == len(cases) and {c[-1] for c in cases} == set(STRATEGIES)
    datas = _datas()
    for (data, model, rank, precision, strategy), fit in zip(cases, out["fits"]):
        case = (data, model, precision, strategy)
        got = np.asarray(fit["elbo"])
        want = np.asarray(_fit(datas, data, model, rank, precision, "scan").elbo)  # this process: the suite's flags
        assert np.all(np.isfinite(got)), case
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        assert err <= RTOL[precision], (case, err)
        if "numpy" in fit and precision == "float64":
            assert abs(fit["loglik"] - fit["numpy"]) <= 1e-9 * abs(fit["numpy"]), case
