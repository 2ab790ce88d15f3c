"""The device a fit runs on: ``cpu``, ``gpu`` or ``auto`` (JAX's default backend), resolved where the
fit runs (a CPU login node has no GPU)."""

from __future__ import annotations

DEVICES = ("cpu", "gpu", "auto")


def resolve_device(name: str):
    """'cpu', 'gpu' or 'auto' (JAX's default backend) -> a jax.Device, with a one-line error."""
    import jax

    if name not in DEVICES:
        raise ValueError(f"device={name!r}: allowed values are {', '.join(DEVICES)}")
    if name == "auto":
        return jax.devices()[0]
    try:
        return jax.devices(name)[0]
    except RuntimeError:
        found = sorted({d.platform for d in jax.devices()})
        raise ValueError(
            f"device={name!r}: no {name.upper()} visible to JAX on this machine "
            f"(found: {', '.join(found)}); use device=cpu or device=auto"
        ) from None
