"""Measuring a fit: the timing protocol, program fingerprints, XLA's statistics, the machine's floor, convergence metrics and information criteria."""
