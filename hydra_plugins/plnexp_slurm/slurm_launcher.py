"""``hydra/launcher=slurm`` (``conf/hydra/launcher/slurm.yaml``): Hydra's submitit SLURM launcher,
with plnexp's wait for the jobs (:func:`plnexp.system.slurm.wait`) in place of submitit's.

Jobs are submitted exactly as ``hydra/launcher=submitit_slurm`` submits them (one job array, the
same parameters); then the driver prints one line per job as it ends, learns from ``squeue`` (not
``sacct``) when a job ended without a result, and cancels the jobs left when it is interrupted. A
job never fails the sweep's machinery: how it ended is in its MLflow run, which the sweep reads.

Hydra imports every module of ``hydra_plugins`` when it looks for plugins, so this one imports the
submitit launcher only if it is installed (plnexp's ``cluster`` extra).
"""

from __future__ import annotations

from pathlib import Path

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurm
except ImportError:  # the cluster extra is not installed: no launcher here
    _SubmititSlurm = None

if _SubmititSlurm is not None:
    from hydra.core.utils import JobReturn, JobStatus, filter_overrides
    from omegaconf import OmegaConf

    class PlnexpSlurmLauncher(_SubmititSlurm):
        def checkpoint(self, *args, **kwargs):
            """Not checkpointable: a fit stopped by SLURM is recorded KILLED, never requeued."""
            return None

        def _executor(self):
            import submitit

            params = dict(self.params)
            folder = params.pop("submitit_folder")
            max_num_timeout = params.pop("max_num_timeout", 0)
            executor = submitit.AutoExecutor(cluster="slurm", folder=folder, slurm_max_num_timeout=max_num_timeout)
            from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

            base = set(OmegaConf.structured(BaseQueueConf).keys())
            executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
            return executor

        def launch(self, job_overrides, initial_job_idx):
            from plnexp.experiment.hydra_compat import job_value, submitit_job_args
            from plnexp.system import slurm
            from plnexp.system.redact import redact_text

            assert self.config is not None
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            sweep_dir.mkdir(parents=True, exist_ok=True)
            executor = self._executor()
            args = submitit_job_args(job_overrides, initial_job_idx)  # before submitting: may refuse
            jobs = executor.map_array(self, *zip(*args))
            total = _total(sweep_dir, initial_job_idx + len(jobs))
            first = jobs[0].job_id.split("_")[0] if jobs else "?"
            print(
                f"submitted {len(jobs)} job(s) to slurm as job array {first}"
                f"{' on partition ' + str(self.params['partition']) if self.params.get('partition') else ''}; "
                f"logs: {jobs[0].paths.stdout if jobs else sweep_dir} and the like",
                flush=True,
            )

            def on_end(e: slurm.JobEnd) -> None:
                label = f"[{initial_job_idx + e.index + 1}/{total}]"
                result = e.result
                if result is not None and result.status == JobStatus.COMPLETED and result.return_value:
                    print(result.return_value, flush=True)
                    return
                what = " ".join(filter_overrides(job_overrides[e.index])) or "(no overrides)"
                why = e.error or (str(job_value(result)) if result is not None else "")
                line = f"{label} {what}: slurm job {e.job} {e.state}{': ' + why if why else ''}"
                print(redact_text(line), flush=True)  # the overrides may hold the store's password

            ended = slurm.wait(jobs, on_end)
            return [_completed(e, job_overrides[e.index]) for e in ended]

    def _completed(e, overrides) -> JobReturn:
        """Every job as COMPLETED for Hydra's sweeper (which raises a FAILED job's error): the job's
        own status is in its MLflow run."""
        r = e.result if e.result is not None else JobReturn(overrides=list(overrides))
        out = JobReturn(
            overrides=r.overrides,
            cfg=r.cfg,
            hydra_cfg=r.hydra_cfg,
            working_dir=r.working_dir,
            task_name=r.task_name,
            status=JobStatus.COMPLETED,
        )
        out.return_value = r.return_value if r.status == JobStatus.COMPLETED else None  # Hydra's public setter
        return out

    def _total(sweep_dir: Path, fallback: int) -> int:
        from plnexp.experiment.sweep import read_record

        record = read_record(sweep_dir)
        return record.total if record is not None else fallback
