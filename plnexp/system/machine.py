"""The machine a process runs on, as the records name it (its CPU model, the cores it may use).
Imports nothing else of plnexp."""

from __future__ import annotations

import os
import platform


def usable_cores() -> int:
    """The cores this process may use (``os.sched_getaffinity``: a SLURM job's allocation, a
    ``taskset``), else the machine's count; at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
