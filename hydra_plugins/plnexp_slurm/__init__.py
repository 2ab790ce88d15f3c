"""plnexp's SLURM launcher for Hydra (``hydra/launcher=slurm``): see :mod:`.slurm_launcher`."""
