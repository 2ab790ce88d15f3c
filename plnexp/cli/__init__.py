"""The command line's own helpers (parser: which command a command line names; doctor); the entry point is :mod:`plnexp.__main__`."""
