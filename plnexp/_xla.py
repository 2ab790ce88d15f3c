"""Guard against a known XLA:CPU miscompilation, applied before JAX starts its backend.

jaxlib 0.10.2 on x86 CPUs miscompiles at least one fused reduction: ``jit`` of
``sum(log(sqrt(2*pi*k)) + k*log(k/e))`` over the oaks counts returns 1113766.9 instead of
1285968.2. Turning off the experimental YNN reduce fusion avoids it. XLA reads ``XLA_FLAGS``
once, when the CPU client is created (lazily, at the first computation), so this must run at
import of :mod:`plnexp`, before any array is made. If JAX's backend was already started
without the flag, :func:`plnexp.fit` still cross-checks every jitted ELBO against a float64
host reference and refuses to report a wrong one (see ``fitting.check_against_host``).
"""

from __future__ import annotations

import os

SAFE_FLAG = "--xla_cpu_experimental_ynn_fusion_type=-reduce"
_FLAG_NAME = SAFE_FLAG.split("=", 1)[0]


def harden_xla_flags(environ: os._Environ | dict = os.environ) -> str:
    """Append :data:`SAFE_FLAG` to ``XLA_FLAGS`` unless the user already set that flag."""
    current = environ.get("XLA_FLAGS", "")
    if _FLAG_NAME not in current:
        environ["XLA_FLAGS"] = f"{current} {SAFE_FLAG}".strip()
    return environ["XLA_FLAGS"]
