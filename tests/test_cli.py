"""End to end: ``python -m plnexp`` on tiny data, into a temporary store. The command line runs in
this process (fixture ``plnexp_main``, the same ``plnexp.__main__.main``) except where a real
interpreter is the point: one happy path (``run``) and the exit of bad input, as processes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import plnexp_cli, store_client
from daemons import free_port

from plnexp.jobs.config import ConfigError

N_CPU = len(jax.devices("cpu"))  # 1, or 2 with JAX_NUM_CPU_DEVICES=2 (.ci/run)
TINY = ["dataset=synthetic", "dataset.n=30", "dataset.p=5", "repeats=1", "warmup=0", "time_budget_s=0"]
METRICS = ("compile_s", "run_s", "ms_per_iter", "n_iter_run", "final_elbo", "loglik")
NOT_MEASURED = ("first_call_s", "compile_warm_s")  # by default: first_call=false, compile_cache auto (one compile)


def all_runs(outputs):
    cl = store_client(outputs)
    exps = [e.experiment_id for e in cl.search_experiments()]
    return cl.search_runs(exps) if exps else []


# The one real process of the happy path: `python -m plnexp run` as a user types it, through the
# module's `if __name__ == "__main__"` (its logging set-up and sys.exit), in a fresh interpreter.
@pytest.mark.slow  # a subprocess paying every import (~9 s); in-process runs are logged in the fast subset
def test_run_logs_one_finished_run(outputs, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = plnexp_cli("run", *TINY, "n_iter=6", "strategy=fori_loop", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("fori_loop-synthetic_n30_p5_d2_s0-f32-cpu") and "FINISHED" in line
    assert list(cwd.iterdir()) == [], "nothing may be written into the working directory"
    (run,) = all_runs(outputs)
    assert run.info.status == "FINISHED"
    for key in METRICS:
        assert np.isfinite(run.data.metrics[key]), key
    for key in NOT_MEASURED:
        assert key not in run.data.metrics, key
    history = store_client(outputs).get_metric_history(run.info.run_id, "elbo")
    assert sorted(h.step for h in history) == list(range(6))
    assert (outputs / "runs").is_dir()


@pytest.mark.slow
def test_sweep_one_parent_children_and_equal_curves(outputs, tmp_path, plnexp_main):
    proc = plnexp_main(
        "sweep",
        "strategy=scan,fori_loop",
        "dataset.replication=1",
        "n_iter=5",
        "repeats=1",
        "warmup=0",
        "time_budget_s=0",
        "report=false",  # the report a real sweep makes at its end: tests/test_report.py, on the session's sweep
        "report.rounds=0",  # its interleaved rounds: tests/test_groups.py
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[2/2] fori_loop-oaks-f32-cpu" in proc.stdout and "0 failed" in proc.stdout
    cl = store_client(outputs)
    exp = cl.get_experiment_by_name("strategies")
    runs = cl.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    by = {r.data.params["strategy.name"]: r for r in children}
    assert by["scan"].info.run_name == "scan-oaks-f32-cpu-n_iter5"
    curves = {
        s: [m.value for m in sorted(cl.get_metric_history(r.info.run_id, "elbo"), key=lambda m: m.step)]
        for s, r in by.items()
    }
    assert len(curves["scan"]) == 5
    np.testing.assert_allclose(curves["scan"], curves["fori_loop"], rtol=1e-5)
    assert by["scan"].data.params["dataset.replication"] == "1"


@pytest.mark.slow  # two fits in process (~3 s)
def test_plain_hydra_multirun_goes_on_after_a_failed_job(outputs, tmp_path, plnexp_main):
    # sgd at lr=1e6 diverges: that job is FAILED with its reason, the other one still runs.
    proc = plnexp_main(
        "run", "--multirun", *TINY, "n_iter=3", "optimizer=sgd,radam_clip", "optimizer.lr=1e6", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr  # a job failed
    assert "[2/2]" in proc.stdout and "1 failed" in proc.stdout
    runs = all_runs(outputs)
    assert len(runs) == 3 and not any(r.info.status == "RUNNING" for r in runs)
    children = {r.data.params["optimizer.name"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert children["sgd"].info.status == "FAILED"
    assert "non-finite ELBO" in children["sgd"].data.tags["status_reason"]
    assert children["radam_clip"].info.status == "FINISHED"


# ---------------------------------------------------------------- bad input: the catalogue
# One row per kind of bad input: the command line, the environment, the words the one line on stderr
# must hold (what is wrong and what is allowed). Every row: exit code 2, one line, no traceback, no
# run in the store, no Hydra run or sweep folder. {name} is a file made by the `bad_files` fixture.
BAD_INPUT = [
    ("no arguments", [], {}, ["plnexp: error: no command", "allowed commands are run, sweep"]),
    ("unknown option", ["run", "--frobnicate"], {}, ["unknown option --frobnicate", "allowed commands"]),
    ("override syntax", ["run", "n_iter=[1,2"], {}, ["bad override", "n_iter=[1,2", "allowed forms"]),
    ("group option", ["run", "precision=float16"], {}, ["precision=float16", "allowed values are float32, float64"]),
    ("strategy typo", ["run", "strategy=scna"], {}, ["strategy=scna", "scan_unrolled"]),
    ("n_iter", ["run", "n_iter=-5"], {}, ["n_iter=-5", "integers >= 1"]),
    # beyond the loops' int32 counter: refused before any run (it was a FAILED run: OverflowError)
    (
        "n_iter above int32",
        ["run", "n_iter=2147483648", "dataset.replication=1"],
        {},
        ["plnexp: error: n_iter=2147483648: allowed values are integers from 1 to 2147483647"],
    ),
    ("n_iter=3e9", ["run", "n_iter=3e9"], {}, ["n_iter=3000000000.0: allowed values are integers"]),
    ("n_iter=1e12", ["run", "n_iter=1e12"], {}, ["n_iter=1000000000000.0: allowed values are integers"]),
    (
        "n_iter above int32 in a sweep",
        ["sweep", "sweep=null", "n_iter=5,2147483648", "dataset.replication=1"],
        {},
        ["n_iter=2147483648: allowed values are integers from 1 to 2147483647"],
    ),
    # a PLN-PCA rank above the data's p (oaks: 114), known once the data is read: before any run
    (
        "pca rank above p",
        ["run", "model=pca", "model.rank=500", "dataset.replication=1"],
        {},
        ["plnexp: error: model.rank=500: allowed values are integers from 1 to the data's p (114)"],
    ),
    (
        "pca rank above p in a sweep",
        ["sweep", "sweep=null", "model=pca", "model.rank=1,3", "dataset=csv", "dataset.counts={counts}"],
        {},
        ["plnexp: error: model.rank=3: allowed values are integers from 1 to the data's p (2)"],
    ),
    ("repeats=0", ["run", "repeats=0"], {}, ["repeats=0", "integers >= 1"]),
    ("lr=-1", ["run", "optimizer.lr=-1"], {}, ["optimizer.lr=-1", "number > 0"]),
    ("replication", ["run", "dataset.replication=0"], {}, ["dataset.replication=0", ">= 1"]),
    ("unknown key", ["run", "nonsense=1"], {}, ["nonsense", "unknown key", "n_iter"]),
    ("replicates=0", ["run", "replicates=0"], {}, ["replicates=0", "integers >= 1"]),
    (
        "replicates of eager",
        ["run", "strategy=eager", "replicates=2"],
        {},
        ["replicates=2: strategy=eager runs one fit per program", "allowed strategies", "while_loop"],
    ),
    (
        "replicates of scan_sharded",
        ["sweep", "sweep=null", "strategy=scan_sharded", "replicates=4"],
        {},
        ["replicates=4: strategy=scan_sharded", "allowed strategies"],
    ),
    (
        "devices",
        ["run", "strategy=scan_sharded", "strategy.devices=64"],
        {},  # more than the suite's CPU devices (1, or 2 with JAX_NUM_CPU_DEVICES=2 as in .ci/run)
        [
            f"strategy.devices=64: only {N_CPU} cpu device(s)",
            "JAX_NUM_CPU_DEVICES",
            f"allowed values are 0 (all) to {N_CPU}",
        ],
    ),
    (
        "via",
        ["run", "strategy=scan_sharded", "strategy.via=pmap"],
        {},
        ["strategy.via='pmap'", "allowed values are jit, shard_map"],
    ),
    ("gpu", ["run", "device=gpu"], {}, ["device='gpu'", "device=cpu"]),
    ("sweep file", ["sweep", "sweep=nope"], {}, ["sweep=nope", "allowed values are", "default"]),
    ("sweep job", ["sweep", "strategy=scan,scna"], {}, ["strategy=scna", "allowed values"]),
    ("launcher", ["sweep", "hydra/launcher=nope"], {}, ["hydra/launcher=nope", "joblib"]),
    ("csv without counts", ["run", "dataset=csv"], {}, ["dataset.counts", "required", "paths of existing CSV"]),
    ("csv missing", ["run", "dataset=csv", "dataset.counts={missing}"], {}, ["dataset.counts=", "existing CSV"]),
    (
        "negative count",
        ["run", "dataset=csv", "dataset.counts={negative}"],
        {},
        ["plnexp: data error: counts file", "negative.csv", "negative count -1", "non-negative integers"],
    ),
    (
        "inf count",
        ["run", "dataset=csv", "dataset.counts={inf}"],
        {},
        ["data error: counts file", "inf.csv", "infinite value at row 2, column 1", "non-negative integers"],
    ),
    (
        "raw offsets <= 0",
        ["run", "dataset=csv", "dataset.counts={counts}", "dataset.offsets={zero}"],
        {},
        ["data error: offsets file", "zero.csv", "offset 0", "finite numbers > 0"],
    ),
    (
        "log offsets inf",
        ["run", "dataset=csv", "dataset.counts={counts}", "dataset.offsets={inf_log}", "dataset.log_offsets=true"],
        {},
        ["data error: offsets file", "inf_log.csv", "infinite value", "finite numbers (log scale"],
    ),
    (
        "rank-deficient",
        ["run", "dataset=csv", "dataset.counts={counts}", "dataset.covariates={constant}"],
        {},
        ["data error: covariates file", "constant.csv", "column 'x'", "linearly independent columns"],
    ),
    (
        "bad data in a sweep",
        ["sweep", "sweep=null", "dataset=csv", "dataset.counts={counts},{negative}"],
        {},
        ["data error: counts file", "negative.csv"],
    ),
    (
        "outputs",
        ["run"],
        {"PLNEXP_OUTPUTS": "{blocker}/outputs"},
        ["PLNEXP_OUTPUTS=", "cannot write there", "allowed values are writable folders"],
    ),
    (
        "store unreachable",
        ["run"],
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
        ["plnexp: store error: MLFLOW_TRACKING_URI=http://127.0.0.1:9: cannot reach", "allowed values"],
    ),
    ("store scheme", ["run", "tracking_uri=nosuch://x"], {}, ["store error: tracking_uri=nosuch://x", "allowed"]),
    # torch missing: simulated here (the availability check patched); for real in tests/test_torch.py
    (
        "torch missing",
        ["run", "strategy=torch_eager"],
        {},
        ["plnexp: error: strategy=torch_eager: PyTorch is not installed", "pip install -e '.[torch]'", "torch==2.13.0"],
    ),
    (
        "torch missing in a sweep",
        ["sweep", "sweep=null", "strategy=scan,torch_compile"],
        {},
        ["strategy=torch_compile: PyTorch is not installed", "pip install -e '.[torch]'"],
    ),
    ("report switch", ["sweep", "report=maybe"], {}, ["report=maybe: allowed values are true, false"]),
    # a sweep is one parent run: its experiment, its store, its sweep file; a grid over them is refused
    (
        "sweep over experiments",
        ["sweep", "experiment=alpha,beta", "n_iter=3", "dataset.replication=1", "strategy=scan"],
        {},
        [
            "plnexp: error: experiment=alpha,beta: a sweep writes into one experiment (its parent run's)",
            "allowed is one value per sweep",
            "run one sweep per value: python -m plnexp sweep sweep=default n_iter=3 dataset.replication=1 "
            "strategy=scan experiment=alpha (then experiment=beta)",
        ],
    ),
    (
        "multirun over stores",
        ["run", "--multirun", "tracking_uri=sqlite:////tmp/a.db,sqlite:////tmp/b.db", "n_iter=3"],
        {},
        [
            "tracking_uri=sqlite:////tmp/a.db,sqlite:////tmp/b.db: a sweep writes into one store",
            "python -m plnexp sweep sweep=null n_iter=3 tracking_uri=sqlite:////tmp/a.db (then ",
        ],
    ),
    (
        "sweep over sweep files",
        ["sweep", "sweep=default,seed"],
        {},
        ["sweep=default,seed: a sweep runs one sweep file", "python -m plnexp sweep sweep=default (then sweep=seed)"],
    ),
    ("report of an empty store", ["report"], {}, ["holds no sweep (no parent run)", "python -m plnexp sweep"]),
    (
        "ui port",
        ["ui", "--port", "99999"],
        {},
        ["plnexp: error: --port 99999: allowed values are integers from 1 to 65535"],
    ),
    ("ui port=0", ["ui", "--port=0"], {}, ["--port 0: allowed values are integers from 1 to 65535"]),
    ("ui port text", ["ui", "-p", "http"], {}, ["--port http: allowed values are integers from 1 to 65535"]),
    ("report argument", ["report", "--since", "1"], {}, ["--since: unknown argument", "--experiment, --run, --out"]),
]


@pytest.fixture
def bad_files(tmp_path):
    files = {
        "counts": "a,b\n1,2\n3,4\n0,1\n",
        "negative": "a,b\n1,2\n-1,4\n0,1\n",
        "inf": "a,b\n1,2\ninf,4\n0,1\n",
        "zero": "a,b\n1,2\n0,4\n1,1\n",
        "inf_log": "a,b\n0,0\n0,-inf\n0,0\n",
        "constant": "x\n1\n1\n1\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.csv"
        paths[name].write_text(text)
    paths["missing"] = tmp_path / "missing.csv"
    paths["blocker"] = tmp_path / "a_file"
    paths["blocker"].write_text("")
    return paths


@pytest.mark.parametrize("args,env,words", [row[1:] for row in BAD_INPUT], ids=[row[0] for row in BAD_INPUT])
def test_bad_input_is_one_line_and_leaves_nothing(outputs, bad_files, monkeypatch, capsys, args, env, words):
    from plnexp.__main__ import main

    if "device=gpu" in args:
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("this machine has a GPU")
    if any(a.startswith("strategy=") and "torch" in a for a in args):
        from plnexp.strategies import torch_loops

        monkeypatch.setattr(torch_loops, "torch_available", lambda: False)  # as if the extra were not installed
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**bad_files))
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code = main([a.format(**bad_files) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert all_runs(outputs) == []
    assert not (outputs / "runs").exists() and not (outputs / "multirun").exists()


def test_hydra_full_error_shows_the_exception(outputs, monkeypatch):
    from plnexp.__main__ import main
    from plnexp.jobs.config import ConfigError

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigError, match="repeats=0"):
        main(["run", "repeats=0"])


@pytest.mark.parametrize(
    "args,words",
    [
        ([], ["no command"]),
        pytest.param(
            ["ui", "--port", "99999"],
            ["--port 99999: allowed values are integers from 1 to 65535"],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["run", "n_iter=2147483648", "dataset.replication=1"],
            ["n_iter=2147483648: allowed values are integers from 1 to 2147483647"],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["run", "dataset=csv", "dataset.counts={negative}"],
            ["data error", "negative count"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_input_exit_code_of_the_real_command(outputs, bad_files, tmp_path, args, words):
    """Processes, as the point: the exit code a real interpreter ends with (``sys.exit`` of
    ``python -m plnexp``) and its whole stderr, which holds only the one line, whatever a fresh
    interpreter prints while it imports and, with data loaded, starts JAX (the rows of the catalogue
    above run in this process, where that has long happened)."""
    proc = plnexp_cli(*[a.format(**bad_files) for a in args], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert all_runs(outputs) == []


@pytest.fixture
def no_server(monkeypatch):
    """``python -m plnexp ui`` may not start mlflow here: a test that reaches it fails."""
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"mlflow ui was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def test_ui_refuses_a_port_in_use_in_one_line(outputs, no_server, capsys):
    import socket

    from plnexp.__main__ import main

    with socket.socket() as taken:  # another server on the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", "--port", str(port), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"plnexp: error: --port {port}: 127.0.0.1:{port} cannot be served: in use"), err
    assert "allowed values are free ports, e.g. --port " in err


def test_ui_checks_the_port_on_the_host_it_serves(no_server):
    import socket

    from plnexp.cli.ui import check_port_free, ui_address

    assert ui_address([]) == ("127.0.0.1", 5000)
    assert ui_address(["--host", "0.0.0.0", "-p", "8080"]) == ("0.0.0.0", 8080)
    assert ui_address(["--port=1", "--port", "65535"]) == ("127.0.0.1", 65535)  # the last, as mlflow takes it
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--port {port}: 0.0.0.0:{port} cannot be served"):
            check_port_free("0.0.0.0", port)
    check_port_free("127.0.0.1", port)  # free again once that server is gone


def test_ui_whose_server_fails_exits_1_in_one_line(outputs, monkeypatch, capsys):
    """mlflow ui ending with an error (a port taken meanwhile, a bad option): plnexp's exit is not 0."""
    import subprocess
    import sys

    from plnexp.__main__ import main

    started = []
    real = subprocess.Popen

    def failing(cmd, **kwargs):  # the command plnexp built, then a server that fails at once
        started.append(cmd)
        return real([sys.executable, "-c", "import sys; sys.exit(3)"], **kwargs)

    monkeypatch.setattr(subprocess, "Popen", failing)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main(["ui", "--port", str(free_port())]) == 1
    (cmd,) = started
    assert cmd[1:4] == ["-m", "mlflow", "ui"]
    err = capsys.readouterr().err.strip()
    assert err == "plnexp: error: mlflow ui exited with code 3 (its own output above says why)"


@pytest.mark.slow  # a real mlflow ui process (~5 s of imports)
def test_ui_with_an_option_mlflow_refuses_exits_1(outputs, tmp_path):
    proc = plnexp_cli("ui", "--port", str(free_port()), "--no-such-option", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "plnexp: error: mlflow ui exited with code 2 (its own output above says why)"
    )


@pytest.mark.slow
def test_run_help_lists_config_groups(tmp_path, plnexp_main):
    proc = plnexp_main("run", "--help", cwd=tmp_path)  # Hydra's help
    assert proc.returncode == 0
    for group in ("dataset:", "optimizer:", "strategy:", "device:", "precision:", "model:", "sweep:"):
        assert group in proc.stdout
    assert "python -m plnexp ui [--port N]" in proc.stdout  # every command with its options
    assert "python -m plnexp sync [tracking_uri=URI]" in proc.stdout


COMMANDS = ("run", "sweep", "report", "rerun", "compare", "sync", "ui", "doctor")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command(plnexp_main, flag):
    from plnexp.cli.parser import COMMANDS as described

    proc = plnexp_main(flag)
    assert proc.returncode == 0 and proc.stderr == ""
    assert tuple(described) == COMMANDS
    for name in COMMANDS:  # each command with its line
        (line,) = [line for line in proc.stdout.splitlines() if line.startswith(f"    {name} ")]
        assert described[name] in line, line
    assert "run and sweep take Hydra overrides" in proc.stdout and "python -m plnexp run --help" in proc.stdout


def test_help_imports_neither_jax_nor_mlflow(tmp_path):
    """What a process imports is the point: ``--help`` and Hydra's ``run --help`` answered in this one
    interpreter (no second one) without JAX or MLflow (``run --help`` composes the configs: Hydra)."""
    import subprocess
    import sys

    said = (
        "import io, sys, contextlib\n"
        "from plnexp.__main__ import main\n"
        "for argv in (['--help'], ['run', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        code = main(argv)\n"
        "    print(code, 'dataset:' in out.getvalue(), sorted(m for m in ('jax', 'mlflow') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", said], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0 False []", "0 True []"], proc.stdout


def test_no_arguments_lists_the_commands_then_one_error_line(plnexp_main):
    proc = plnexp_main()
    assert proc.returncode == 2
    assert all(name in proc.stdout for name in COMMANDS)
    (err,) = proc.stderr.strip().splitlines()
    assert err.startswith("plnexp: error: no command; usage: python -m plnexp {run,sweep,")
    assert f"allowed commands are {', '.join(COMMANDS)}" in err


def test_an_unknown_command_is_one_line_and_exit_2(outputs, capsys):
    from plnexp.__main__ import main

    assert main(["frobnicate", "n_iter=5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "plnexp: error: unknown command 'frobnicate'; allowed commands are run, sweep, report, rerun, compare, "
        "sync, ui, doctor\n"
    )
    assert all_runs(outputs) == [] and not (outputs / "runs").exists()


def test_overrides_alone_mean_run():
    from plnexp.cli.parser import parse

    def said(argv):
        ns = parse(argv)
        return ns.command, [*ns.hydra_flags, *(["--multirun"] if ns.multirun else []), *ns.overrides]

    assert said(["n_iter=5", "dataset.replication=1"]) == ("run", ["n_iter=5", "dataset.replication=1"])
    assert said(["+extra=1"]) == ("run", ["+extra=1"])
    assert said(["~peers"]) == ("run", ["~peers"])
    assert said(["--multirun", "n_iter=5,6"]) == ("run", ["--multirun", "n_iter=5,6"])
    assert said(["--cfg", "job"]) == ("run", ["--cfg", "job"])  # Hydra's flags: Hydra answers
    assert said(["sweep", "sweep=seed"]) == ("sweep", ["sweep=seed"])
    assert said(["run", "a=1", "--cfg", "job", "b=2"]) == ("run", ["--cfg", "job", "a=1", "b=2"])  # order kept
    assert parse(["report", "--run", "x"]).args == ["--run", "x"]  # for the command's own parser, as given
    ns = parse(["sweep", "--dry-run", "--json", "-cd", "/d", "n_iter=3"])
    assert (ns.dry_run, ns.json, ns.config_dir, ns.overrides) == (True, True, ["/d"], ["n_iter=3"])
    assert parse(["--help"]) is None  # printed
    with pytest.raises(ValueError, match="unknown command 'sweeep'; allowed commands are run, sweep"):
        parse(["sweeep"])
    with pytest.raises(ValueError, match="unknown option --dry-run; usage: "):  # a sweep's option only
        parse(["run", "--dry-run"])
    for flag in ("-cd", "--cfg"):  # named by its long name, whichever was given
        with pytest.raises(ValueError, match=f"^--{'config-dir' if flag == '-cd' else 'cfg'}: needs a value; usage: "):
            parse(["run", flag])


@pytest.mark.parametrize("name", [c for c in COMMANDS if c not in ("run", "sweep", "ui")])
def test_each_command_help_prints_its_usage(outputs, plnexp_main, name):
    proc = plnexp_main(name, "--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"usage: python -m plnexp {name}")
    assert "-h, --help" in proc.stdout


def test_sync_parse_errors_are_one_line(outputs, plnexp_main):
    proc = plnexp_main("sync", "frob=1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "plnexp: error: unknown argument frob=1; usage: python -m plnexp sync [tracking_uri=URI]\n"
    proc = plnexp_main("sync", "--frob")
    assert proc.returncode == 2
    assert proc.stderr.startswith("plnexp: error: unknown argument --frob; usage: python -m plnexp sync")


@pytest.mark.parametrize("launcher", ["slurm", "submitit_slurm"])
def test_a_cluster_launcher_without_its_extra_says_what_to_install(outputs, capsys, monkeypatch, launcher):
    """(The extra looks uninstalled: its module is not found, whatever this machine has.)"""
    import importlib.util

    from plnexp.__main__ import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if "submitit" in name else find_spec(name, *a)
    )
    assert main(["sweep", f"hydra/launcher={launcher}", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"plnexp: error: hydra/launcher={launcher}: needs hydra-submitit-launcher, which is not "
        "installed; install plnexp's cluster extra (pip install -e '.[cluster]'); allowed values here are "
        "basic, joblib"
    )
    cl = store_client(outputs)  # nothing created
    assert not [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])]


def test_a_slurm_launcher_without_sbatch_says_so(outputs, capsys, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs plnexp's cluster extra")
    from plnexp.__main__ import main

    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["sweep", "hydra/launcher=slurm", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("plnexp: error: hydra/launcher=slurm: sbatch not found on PATH") and "\n" not in err
    cl = store_client(outputs)  # nothing created
    assert not [r for e in cl.search_experiments() for r in cl.search_runs([e.experiment_id])]


# ---------------------------------------------------------------- one parent, names apart
UNTIMED = [o for o in TINY if o.split("=")[0] not in ("repeats", "warmup")]  # the tests below sweep them


def test_a_sweep_file_sweeping_the_experiment_is_refused(tmp_path, monkeypatch):
    """The same refusal for a grid that a sweep file's hydra.sweeper.params makes (a copy of conf/
    with one more sweep file)."""
    import shutil

    from plnexp.experiment import plan
    from plnexp.jobs import config as C

    conf = tmp_path / "conf"
    shutil.copytree(C.CONF_DIR, conf)
    (conf / "sweep" / "two_experiments.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      experiment: alpha,beta\n      seed: 0,1\n"
    )
    monkeypatch.setattr(C, "CONF_DIR", conf)
    with pytest.raises(C.ConfigError) as e:
        plan.plan(["sweep=two_experiments", "n_iter=3"], multirun=True, check_device=False)
    assert str(e.value).startswith(
        "experiment=alpha,beta (swept by sweep=two_experiments): a sweep writes into one experiment (its parent "
        "run's), so allowed is one value per sweep; run one sweep per value: python -m plnexp sweep "
        "sweep=two_experiments n_iter=3 experiment=alpha (then experiment=beta)"
    )
    jobs = plan.plan(["sweep=two_experiments", "n_iter=3", "experiment=alpha"], multirun=True, check_device=False)
    assert [j.config.seed for j in jobs] == [0, 1]  # one value given: the grid runs


@pytest.mark.slow
def test_job_names_are_unique_within_a_sweep():
    """A key the name hides (the timing protocol: repeats) shows in every job's name where it alone
    tells jobs apart; names that differ already stay as they were."""
    from plnexp.experiment import plan

    base = [*UNTIMED, "n_iter=3"]  # a plain multirun (the command line's sweep=null)
    jobs = plan.plan([*base, "strategy=scan,fori_loop", "repeats=1,2"], multirun=True, check_device=False)
    names = [j.name for j in jobs]
    assert len(set(names)) == 4 and names[:2] == [
        "scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3-repeats1",
        "scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3-repeats2",
    ]
    jobs = plan.plan([*base, "seed=0,1"], multirun=True, check_device=False)
    assert [j.name for j in jobs] == [
        "scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3-seed0",
        "scan-synthetic_n30_p5_d2_s1-f32-cpu-n_iter3-seed1",  # synthetic data's seed follows seed
    ] and {j.shown for j in jobs} == {()}
    (one,) = plan.plan([*UNTIMED, "n_iter=3", "repeats=2"], multirun=False, check_device=False)
    assert one.name == "scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3"  # protocol switches do not rename a run


def test_a_sweeps_runs_carry_the_names_apart(outputs, tmp_path, monkeypatch, plnexp_main):
    """The names the sweep's jobs give their runs (each job names itself, in whatever process runs
    it: the sweep's record tells it the keys to show), with a stand-in fit."""
    from plnexp.experiment import runner

    def finished(cfg, outcomes):
        (outcome,) = outcomes
        outcome.ended = outcome.started + 0.5
        return outcomes

    monkeypatch.setattr(runner, "execute", finished)
    ran = plnexp_main("sweep", "sweep=null", *UNTIMED, "n_iter=3", "warmup=0,1", "report=false", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    names = sorted(r.info.run_name for r in all_runs(outputs) if "mlflow.parentRunId" in r.data.tags)
    assert names == [f"scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3-warmup{w}" for w in (0, 1)]
    assert "[2/2] scan-synthetic_n30_p5_d2_s0-f32-cpu-n_iter3-warmup1" in ran.stdout
