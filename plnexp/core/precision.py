"""The precisions a fit runs in: one record each (dtype, label, tolerances), declared once.

A leaf module (numpy only): the config, the fit, the doctor, reruns and reports read a precision's
numbers from here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


FLOOR_ULPS = 4  # the host check's absolute floor, in units of size * eps * |log eps| (Precision.check_tolerance)
TERMS_ULPS = 16  # and its rounding of the terms summed, in units of eps * sum |terms| (Precision.check_tolerance)


@dataclass(frozen=True)
class Precision:
    """``check_rtol``: how far (relative) a compiled ELBO may be from the float64 host reference
    (plus an absolute floor, :meth:`check_tolerance`). float32: a sum of n*p terms of size up to
    ~1e4 carries relative rounding ~1e-6 (measured <= 3e-6 on oaks x100); 1e-4 leaves margin and still
    catches a miscompiled reduction (the jaxlib 0.10.2 one is off by 13%).
    ``curve_rtol``: how far two ELBO curves of one configuration may differ (max relative difference)
    when they are not expected to be bit for bit equal (another device, jax version, fusion): the
    strategy tests' tolerances."""

    name: str
    dtype: type
    label: str  # in run names: scan-oaks-f32-cpu
    check_rtol: float
    curve_rtol: float

    @property
    def eps(self) -> float:
        return float(np.finfo(self.dtype).eps)

    @property
    def x64(self) -> bool:
        return self.dtype == np.float64

    def check_tolerance(self, host: float, size: int, terms: float = 0.0) -> float:
        """How far a compiled ELBO may be from the float64 host reference ``host``: ``check_rtol * |host|``
        plus the rounding of the terms summed, ``TERMS_ULPS * eps * terms`` (``terms``: the sum of the
        magnitudes of the ELBO's terms, :func:`plnexp.core.reference.elbo_and_terms`), plus an absolute
        floor ``FLOOR_ULPS * size * eps * |log eps|`` (``size`` = n*p entries).

        Rounding scales with the terms, not with their sum: where they cancel it is far above
        ``check_rtol * |host|`` (a count of 1e12: Y Z and log Y! near 3e13 each, the ELBO a few
        hundred; float64 errors of 4e-3, float32 ones of 1e5 from the count's own rounding to
        float32, 0.02 eps * terms). On oaks the terms are 100 times |ELBO|, their part of the bound 6
        nats in float32 (a 1% error, 320, is refused). The ELBO
        sums n*p entries whose terms (log S^2 against log det Sigma, Y*Z against exp(Z + S^2/2)) can
        each be as large as |log eps| and cancel, so where the ELBO tends to 0 (all-zero counts) a
        purely relative test fails on rounding alone. 20x4 zeros after 1000 iterations, measured
        absolute errors: XLA's default code 1.4e-13 (float64) and 3.8e-5 (float32); the same HLO with
        LLVM at -O0 (``--xla_backend_optimization_level=0``: sums in another order, no fused
        multiply-adds) 7.4e-13 (full, float64) and 2.8e-4 (profiled, float32), 1.2x and 1.8x
        ``size * eps * |log eps|``; hence a floor of 4 times that (2.6e-12 and 6.1e-4 there), which
        a compiler's or a device's other summation order stays within. On oaks x100 (float32) the
        floor is 10 nats, far below the 1.7e5 of the jaxlib 0.10.2 miscompile."""
        rounding = TERMS_ULPS * self.eps * abs(terms) + FLOOR_ULPS * size * self.eps * abs(np.log(self.eps))
        return self.check_rtol * abs(host) + rounding


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("float32", np.float32, "f32", check_rtol=1e-4, curve_rtol=1e-5),
        Precision("float64", np.float64, "f64", check_rtol=1e-9, curve_rtol=1e-9),
    )
}


def precision(name: str) -> Precision:
    """The record of ``name``, or a one-line ValueError naming the allowed values."""
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"precision={name!r}: allowed values are {', '.join(PRECISIONS)}") from None
