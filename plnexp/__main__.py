"""``python -m plnexp run|sweep|ui [overrides]``: the command line.

Every command validates its whole job list (the sweep grid expanded, each job's config composed
and loaded) before any work: a bad value is one line on stderr and exit code 2, with no MLflow
store opened and no run created. Then Hydra runs the job(s) (its run/sweep dirs under outputs/).
"""

from __future__ import annotations

import plnexp  # noqa: F401  (first: sets XLA_FLAGS before JAX starts)

import os
import signal
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import cli, runner
from . import config as C

USAGE = """usage: python -m plnexp {run,sweep,ui} [overrides ...]

  run   [overrides]              one fit, logged to MLflow; prints a one-line summary
  sweep [sweep=NAME] [overrides] a Hydra multirun of a grid (conf/sweep/NAME.yaml, default: default)
  ui    [mlflow ui options]      mlflow ui on the project's store, bound to 127.0.0.1
  --help                         the config groups and their options (Hydra's help)
"""
HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p",
               "--shell-completion", "-sc", "--version"}
_STATE = {"failed": 0}


@hydra.main(config_path=str(C.CONF_DIR), config_name="config", version_base="1.3")
def hydra_job(cfg: DictConfig) -> None:
    """One Hydra job: load the typed config, fit, log. Never raises for a failed fit."""
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    config = C.load(cfg)
    if runner.SWEEP is None and str(hc.mode) == "RunMode.MULTIRUN":  # launched without our driver
        runner.open_sweep("multirun", config.experiment, 0, config.tracking_uri, {"command": "multirun"})
    outcome = runner.run_job(config, overrides, cli.job_name(config, overrides), hc.runtime.output_dir,
                             progress=_progress)
    _STATE["failed"] += outcome.status != "FINISHED"
    if runner.SWEEP is None:
        print(f"{outcome.summary()}  (run {outcome.run_id}, experiment {config.experiment!r})", flush=True)


def _progress(text: str, end: str) -> None:
    print(text, end=end, flush=True)


def _hydra(args: list[str]) -> None:
    sys.argv = [sys.argv[0] if sys.argv else "plnexp", *args]
    hydra_job()


def ui(args: list[str]) -> int:
    from . import tracking

    uri = tracking.tracking_uri(None)
    art = C.outputs_dir() / "mlartifacts"
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--artifacts-destination",
           art.as_uri(), "--host", "127.0.0.1", *args]
    print(" ".join(cmd), flush=True)
    os.chdir(C.outputs_dir())
    os.execv(sys.executable, cmd)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    if args[0] == "doctor":
        from .doctor import main as doctor

        return doctor(args[1:])
    command = args.pop(0) if args[0] in ("run", "sweep", "ui") else "run"
    if command == "ui":
        return ui(args)
    if command == "sweep" and not any(a.startswith("sweep=") for a in args):
        args.insert(0, "sweep=default")
    if any(a.split("=")[0] in HYDRA_FLAGS for a in args):
        _hydra(args)  # help and inspection flags: Hydra answers them
        return 0
    multirun = command == "sweep" or "-m" in args or "--multirun" in args
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    unknown = [a for a in overrides if a.startswith("-")]
    if unknown:
        print(f"plnexp: error: unknown option {unknown[0]}\n{USAGE}", file=sys.stderr)
        return 2
    multirun = multirun or any(o.startswith("sweep=") and o != "sweep=null" for o in overrides)
    try:
        jobs = cli.plan(overrides, multirun)
    except C.ConfigError as e:
        print(f"plnexp: error: {e}", file=sys.stderr)
        return 2
    if not multirun:
        _hydra(overrides)
        return 1 if _STATE["failed"] else 0

    sweep_name = next((o.split("=", 1)[1] for o in overrides if o.startswith("sweep=")), "multirun")
    first = jobs[0].config
    print(f"sweep {sweep_name}: {len(jobs)} jobs, experiment {first.experiment!r}", flush=True)
    runner.open_sweep(f"{sweep_name}-{time.strftime('%Y%m%d-%H%M%S')}", first.experiment, len(jobs),
                      first.tracking_uri, {"command": " ".join(["sweep", *overrides]), "sweep": sweep_name})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` below still closes the parent
    status = "FAILED"
    try:
        _hydra(["--multirun", *overrides])
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        runner.close_sweep(status)
        sweep = runner.SWEEP
        if sweep is not None and sweep.outcomes:
            print(runner.summary_table(sweep.outcomes), flush=True)
            fit_s = sum(o.wall_s for o in sweep.outcomes)
            total = time.perf_counter() - sweep.started
            print(f"{len(sweep.outcomes)}/{sweep.total} jobs, {_STATE['failed']} failed; "
                  f"{total:.1f} s in the sweep, {fit_s:.1f} s in fits ({100 * (1 - fit_s / total):.0f}% outside); "
                  f"parent run {sweep.parent_id}", flush=True)
    return 1 if _STATE["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
