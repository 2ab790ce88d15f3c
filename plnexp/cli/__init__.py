"""The command line's own helpers (doctor); the entry point is :mod:`plnexp.__main__`."""
