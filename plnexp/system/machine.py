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


def _meminfo(key: str) -> int | None:
    """``key``'s value in /proc/meminfo, in bytes (None where not readable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == key:
                    return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2) may still use: ``memory.max`` less ``memory.current`` (None:
    no limit, or not readable)."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = f"/sys/fs/cgroup{path}"
        with open(f"{folder}/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(f"{folder}/memory.current") as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        return None


def available_memory() -> tuple[int | None, str]:
    """The memory new work may take (bytes) and where that figure comes from: the kernel's
    ``MemAvailable`` (/proc/meminfo), or less where this process's cgroup allows less; (None, "")
    where neither is readable (not Linux)."""
    found = [(b, w) for b, w in ((_meminfo("MemAvailable"), "available"), (_cgroup_room(), "left to its cgroup")) if b]
    if not found:
        return None, ""
    nbytes, where = min(found)
    return nbytes, f"of memory {where} on this machine"


def resident_memory() -> int:
    """This process's resident memory (bytes; /proc/self/statm), 0 where not readable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
