"""The process and the machine: paths, process settings (XLA flags, threads), secrets masking, SLURM's environment, interrupts. Imports nothing else of plnexp."""
