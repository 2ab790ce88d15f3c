"""The machine a process runs on, as the records name it (its CPU model). Imports nothing else of
plnexp."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The host CPU's model name (Linux: /proc/cpuinfo), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"
