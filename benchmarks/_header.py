"""The lines every benchmark prints first: what ran, where, with which versions and XLA flags."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys


def machine_header(title: str, argv=None) -> list[str]:
    """``# <title>  <time>``, the command, the machine, jax/jaxlib and devices, XLA_FLAGS."""
    import jax
    import jaxlib

    args = sys.argv[1:] if argv is None else list(argv)
    return [
        f"# {title}  {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"# command: {shlex.join([sys.executable, sys.argv[0], *args])}",
        f"# machine: {platform.platform()}  {platform.processor() or platform.machine()}  "
        f"cpu_count={os.cpu_count()}  python {platform.python_version()}",
        f"# jax {jax.__version__}  jaxlib {jaxlib.__version__}  backend={jax.default_backend()}  "
        f"devices={[str(d) for d in jax.devices()]}",
        f"# XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}",
    ]


def proc_status_kb(key: str) -> int | None:
    """A field of /proc/self/status in kB (VmRSS, VmHWM...); None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
