"""One fit from Python: its spec (FitSpec, resolved once), :func:`plnexp.fit`, the reference optimum and the memory probe."""
