"""``python -m plnexp doctor``: the numerics pass here and fail loudly on a wrong jitted value; the
store check fails for an unwritable or unreachable store; the XLA-flag logic; the command's exit code."""

import json
import os
import tempfile
from pathlib import Path

import jax
import pytest

from plnexp.cli import doctor
from plnexp.cli.doctor import jitted_numerics
from plnexp.cli.doctor import machine
from plnexp.cli.doctor import store_local
from plnexp.cli.doctor import store_server
from plnexp.system import runtime
from plnexp.core.model import MODELS, PCA_NAME

CPU = jax.devices("cpu")[0]
# full, profiled and pca (rank jitted_numerics.PCA_RANK)
CHECKED = {m.name: m for m in jitted_numerics.checked_models()}


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("model", list(CHECKED))
def test_jitted_elbo_matches_host_reference_here(oaks, model, precision):
    check = jitted_numerics.elbo_check(CHECKED[model], CPU, precision, oaks)
    assert check.ok is True, check.detail
    assert check.name == f"elbo[{model},{precision},cpu:{CPU.id}]"


@pytest.mark.parametrize("model", list(CHECKED))
def test_wrong_jitted_value_fails_naming_model_device_dtype(oaks, model):
    # off by 1e-3 relative: ten times the float32 tolerance, far below the 13% of the known miscompile
    def perturbed(m, state, arrays):
        value = jitted_numerics.jitted_state_elbo(m, state, arrays)
        return value + 1e-3 * abs(float(value))

    check = jitted_numerics.elbo_check(
        CHECKED[model],
        CPU,
        "float32",
        oaks,
        functions=[("value_and_grad", jitted_numerics.jitted_value_and_grad), ("state_elbo", perturbed)],
    )
    assert check.ok is False
    assert check.label == "FAIL"
    for word in (f"model {model}", f"cpu:{CPU.id}", "float32", "jitted state_elbo", "relative error"):
        assert word in check.detail, (word, check.detail)
    assert "\n" not in check.detail


def test_the_pca_check_is_against_pca_elbo_at_the_rotated_axes(oaks):
    """PLN-PCA at rank jitted_numerics.PCA_RANK is among the checked models; its host value is
    reference.pca_elbo at (B, C Q, M Q, S), Q the Cayley transform of R - R' (by NumPy here), R not 0."""
    import numpy as np

    from plnexp.core import reference

    assert list(CHECKED) == [*MODELS, PCA_NAME] and CHECKED[PCA_NAME].rank == jitted_numerics.PCA_RANK
    params = jitted_numerics.random_params(CHECKED[PCA_NAME], oaks)
    W = params["R"] - params["R"].T
    assert np.abs(W).max() > 0.01  # a rotation: Q is not I
    eye = np.eye(jitted_numerics.PCA_RANK)
    Q = np.linalg.solve(eye - W, eye + W)
    want = reference.pca_elbo(oaks.Y, oaks.O, oaks.X, params["B"], params["C"] @ Q, params["M"] @ Q, params["S"])
    check = jitted_numerics.elbo_check(CHECKED[PCA_NAME], CPU, "float64", oaks)
    assert check.ok is True and f"= {want:.4f} within" in check.detail, (want, check.detail)
    wrong = jitted_numerics.elbo_check(
        CHECKED[PCA_NAME], CPU, "float64", oaks, functions=[("state_elbo", lambda m, s, a: float("nan"))]
    )
    assert wrong.ok is False and f"model pca (rank {jitted_numerics.PCA_RANK}) on cpu:" in wrong.detail


def test_nan_jitted_value_fails(oaks):
    check = jitted_numerics.elbo_check(
        MODELS["full"], CPU, "float64", oaks, functions=[("state_elbo", lambda m, s, a: float("nan"))]
    )
    assert check.ok is False and "nan" in check.detail


def test_miscompile_probe_passes_here_and_fails_on_a_wrong_sum(oaks):
    assert jitted_numerics.stirling_probe(CPU, oaks).ok is True
    # what jaxlib 0.10.2 gave without the flag
    wrong = jitted_numerics.stirling_probe(CPU, oaks, jitted=lambda k: 1113766.9)
    assert wrong.ok is False
    assert "1113766.9" in wrong.detail and "1285968.2" in wrong.detail


@pytest.mark.slow
def test_numerics_covers_every_device_model_and_precision():
    names = {c.name for c in doctor.numerics()}
    for dev in machine.all_devices():
        label = machine.device_label(dev)
        assert f"miscompile_probe[{label}]" in names
        for model in CHECKED:
            for precision in ("float32", "float64"):
                assert f"elbo[{model},{precision},{label}]" in names


@pytest.mark.own_compile_cache  # nothing in outputs but the store: not even the link to the session's cache
def test_store_under_a_writable_outputs_dir_passes(outputs):
    found = {c.name: c for c in doctor.store()}
    assert found["store_reachable"].ok is True and found["store_writable"].ok is True
    assert str(outputs) in found["store_writable"].detail
    assert sorted(p.name for p in outputs.iterdir()) == ["mlflow.db"]  # the temp file is gone, nothing created


@pytest.fixture
def read_only_dir(tmp_path):
    """An existing directory this user cannot create files in: a 0o500 one, or for root (whom modes do
    not stop) /sys where the kernel refuses new files; skipped where neither holds."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):
            yield ro
            return
        try:
            tempfile.NamedTemporaryFile(dir="/sys").close()
        except OSError:
            yield Path("/sys")
            return
        pytest.skip("this user can write to a 0o500 directory and to /sys")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("sub", ["", "outputs"])  # the outputs dir itself, or one not created yet inside it
def test_store_in_a_read_only_outputs_dir_fails(read_only_dir, monkeypatch, sub):
    before = sorted(read_only_dir.iterdir())
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(read_only_dir / sub))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    found = doctor.store()
    failed = [c for c in found if c.ok is False]
    assert len(failed) == 1 and str(read_only_dir) in failed[0].detail, found
    if not sub:  # the directory is there, but nothing can be written in it
        assert [(c.name, c.ok) for c in found if c.name != "store_filesystem"] == [
            ("store_reachable", True),
            ("store_writable", False),
        ]
    assert sorted(read_only_dir.iterdir()) == before


def test_store_not_created_yet_passes_and_stays_uncreated(tmp_path, monkeypatch):
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(tmp_path / "fresh" / "outputs"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    found = {c.name: c for c in doctor.store()}
    assert found["store_reachable"].ok is True and "not created yet" in found["store_reachable"].detail
    assert found["store_writable"].ok is True and str(tmp_path) in found["store_writable"].detail
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []  # no store, no file left behind


def test_store_whose_outputs_dir_cannot_exist_fails(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")  # a file where a directory would have to be: fails even for root
    monkeypatch.setenv("PLNEXP_OUTPUTS", str(tmp_path / "a_file" / "outputs"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    [check] = doctor.store()
    assert check.ok is False and check.name == "store_reachable"
    assert str(tmp_path / "a_file") in check.detail and "directory" in check.detail


@pytest.mark.parametrize("via_env", [True, False])
def test_store_on_an_http_port_nobody_listens_to_fails_and_writes_nothing(monkeypatch, via_env):
    import daemons

    uri = f"http://127.0.0.1:{daemons.free_port()}"  # bound then closed: nobody listens there
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):  # a proxy would answer for the port
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    found = doctor.store() if via_env else doctor.store(uri)  # refused at once, or after the short timeout
    assert [(c.name, c.ok) for c in found] == [
        ("store_reachable", False),
        ("store_writable", None),
        ("store_artifacts", None),
    ], found
    assert uri in found[0].detail
    assert all("not checked: server unreachable" in c.detail for c in found[1:]), found


def test_unchecked_jaxlib_gets_an_info_line_and_no_flags():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    [check] = doctor.xla_flags(env, version="99.0.0")
    assert check.ok is None and check.label == "info"
    assert "plnexp added no XLA flags" in check.detail and "99.0.0" in check.detail
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # reporting changes nothing


def test_checked_jaxlib_reports_the_flags_and_misses_a_missing_one():
    version = runtime.CHECKED_JAXLIB[0]
    env = {}
    runtime.set_xla_flags(env, version=version)
    [check] = doctor.xla_flags(env, version=version)
    assert check.ok is True and runtime.SAFETY_FLAGS[0].split("=")[0] in check.detail
    [check] = doctor.xla_flags({}, version=version)  # XLA_FLAGS lost after import
    assert check.ok is False and runtime.SAFETY_FLAGS[0].split("=")[0] in check.detail
    name = runtime.SAFETY_FLAGS[0].split("=")[0]
    env = {"XLA_FLAGS": f"{name}=-individual_dot"}  # the user's value for the name, kept by plnexp, unsafe
    runtime.set_xla_flags(env, version=version)
    [check] = doctor.xla_flags(env, version=version)
    assert check.ok is False and f"{name}=-individual_dot" in check.detail and "safety" in check.detail


def test_a_raising_check_is_a_failure_not_a_crash():
    def broken():
        raise RuntimeError("no backend\nsecond line")

    [check] = doctor._guarded(broken)
    assert check == doctor.Check("broken", False, "raised RuntimeError: no backend")


def test_main_exit_status_follows_the_checks(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "checks", lambda: [doctor.Check("a", True, "fine"), doctor.Check("b", None, "note")])
    assert doctor.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["ok", "info", "doctor:"]
    monkeypatch.setattr(doctor, "checks", lambda: [doctor.Check("a", True, "fine"), doctor.Check("b", False, "bad")])
    assert doctor.main(["--json"]) == 1
    assert json.loads(capsys.readouterr().out) == [
        {"name": "a", "ok": True, "detail": "fine"},
        {"name": "b", "ok": False, "detail": "bad"},
    ]
    assert doctor.main(["--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err


@pytest.mark.slow  # every check for real: the numerics compile each model and precision (~3 s)
def test_doctor_command_exits_0_with_a_line_per_check(outputs, tmp_path, plnexp_main):
    out = plnexp_main("doctor", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("doctor: all ")
    names = [line.split()[1] for line in lines[:-1]]
    assert all(line.split()[0] in ("ok", "info") for line in lines[:-1]), out.stdout
    for name in (
        "versions",
        "devices",
        "x64",
        "xla_flags",
        "lapack_threads",
        "store_reachable",
        "store_writable",
        "miscompile_probe[cpu:0]",
        "elbo[full,float32,cpu:0]",
        "elbo[profiled,float64,cpu:0]",
        "elbo[pca,float32,cpu:0]",
        "elbo[pca,float64,cpu:0]",
    ):
        assert name in names, (name, out.stdout)
    assert int(lines[-1].split()[2]) == sum(line.startswith("ok") for line in lines[:-1])


MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /shared nfs4 rw,vers=4.2 0 0
server:/export/proj\\040x /shared/proj\\040x nfs rw 0 0
lfs@o2ib:/scratch /scratch lustre rw 0 0
tmpfs /scratch/tmp\\011a\\134b tmpfs rw 0 0
"""


def test_filesystem_of_takes_the_longest_mount_point():
    assert store_local.filesystem_of(Path("/shared/proj/outputs/mlflow.db"), MOUNTS) == ("nfs4", "/shared")
    assert store_local.filesystem_of(Path("/shared"), MOUNTS) == ("nfs4", "/shared")
    assert store_local.filesystem_of(Path("/home/u/outputs/mlflow.db"), MOUNTS) == ("ext4", "/")
    assert store_local.filesystem_of(Path("/sharedness/mlflow.db"), MOUNTS) == ("ext4", "/")  # a prefix, not a parent
    assert store_local.filesystem_of(Path("/scratch/u/mlflow.db"), MOUNTS) == ("lustre", "/scratch")
    assert store_local.filesystem_of(Path("/x"), "") is None


def test_filesystem_of_decodes_escaped_mount_points_and_takes_the_last_mount():
    assert store_local.filesystem_of(Path("/shared/proj x/mlflow.db"), MOUNTS) == ("nfs", "/shared/proj x")
    assert store_local.filesystem_of(Path("/shared/proj/mlflow.db"), MOUNTS) == ("nfs4", "/shared")
    assert store_local.filesystem_of(Path("/scratch/tmp\ta\\b/mlflow.db"), MOUNTS) == ("tmpfs", "/scratch/tmp\ta\\b")
    over = MOUNTS + "server2:/x /shared nfs rw 0 0\n"  # mounted over /shared: the later one is what is seen
    assert store_local.filesystem_of(Path("/shared/a/mlflow.db"), over) == ("nfs", "/shared")


def _mounted(tmp_path, fstype):
    return f"/dev/vda1 / ext4 rw 0 0\nserver:/export {str(tmp_path).replace(' ', chr(92) + '040')} {fstype} rw 0 0\n"


@pytest.mark.parametrize("fstype", ["nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "fuse.sshfs"])
def test_a_sqlite_store_on_a_network_filesystem_is_a_warning_not_a_failure(monkeypatch, tmp_path, fstype):
    monkeypatch.setattr(store_local, "_mounts_text", lambda: _mounted(tmp_path, fstype))
    found = doctor.store(f"sqlite:///{tmp_path}/mlflow.db")
    assert [(c.name, c.ok) for c in found] == [
        ("store_reachable", True),
        ("store_writable", True),
        ("store_filesystem", None),
    ], found
    check = found[-1]
    assert check.label == "info" and check.detail.startswith(f"warning: sqlite store on {fstype} ({tmp_path}): ")
    for words in ("sqlite locking is unsafe", "database is locked", "README 'A shared tracking server'"):
        assert words in check.detail, (words, check.detail)
    assert "\n" not in check.detail
    assert doctor.summary(found) == "doctor: all 2 checks passed (1 info; warnings: store_filesystem)"
    monkeypatch.setattr(doctor, "checks", lambda: found)
    assert doctor.main([]) == 0  # a warning fails nothing


@pytest.mark.parametrize(
    "mounts, ok, detail",
    [
        (lambda t: _mounted(t, "ext4"), True, "sqlite store on ext4"),
        (lambda t: "/dev/vda1 / xfs rw 0 0\n", True, "sqlite store on xfs (/)"),
        (lambda t: "", None, "not known"),
    ],
)
def test_a_sqlite_store_on_a_local_filesystem_passes(monkeypatch, tmp_path, mounts, ok, detail):
    monkeypatch.setattr(store_local, "_mounts_text", lambda: mounts(tmp_path))
    found = {c.name: c for c in doctor.store(f"sqlite:///{tmp_path}/outputs/mlflow.db")}  # outputs/ not made yet
    assert found["store_filesystem"].ok is ok and detail in found["store_filesystem"].detail, found
    assert not found["store_filesystem"].detail.startswith("warning")
    assert list(tmp_path.iterdir()) == []


def test_the_real_mounts_name_the_filesystem_of_the_tests_folder(tmp_path):
    if not Path("/proc/self/mounts").exists():
        pytest.skip("no /proc/self/mounts here")
    [check] = [c for c in doctor.store(f"sqlite:///{tmp_path}/mlflow.db") if c.name == "store_filesystem"]
    assert check.ok in (True, None) and "sqlite store on " in check.detail


class FakeClient:
    """An ``MlflowClient`` whose calls are recorded and whose method ``failing`` raises."""

    failing = ""
    calls: list = []

    def __init__(self, uri):
        self.uri = uri

    def __getattr__(self, name):
        def call(*args, **kwargs):
            FakeClient.calls.append((name, os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT")))
            if name == self.failing:
                raise RuntimeError(f"{name} refused\nsecond line")
            if name == "get_experiment_by_name":
                return None
            if name == "create_run":
                return type("Run", (), {"info": type("Info", (), {"run_id": "r1"})})()
            if name == "download_artifacts":
                Path(args[2], "doctor.txt").write_text("plnexp doctor r1")
                return str(Path(args[2], "doctor.txt"))
            if name == "get_run":
                return type("Run", (), {"info": type("Info", (), {"artifact_uri": "/nfs/mlruns/1/r1/artifacts"})})()
            return "1"

        return call


@pytest.mark.parametrize("failing", ["", "create_run", "log_metric", "log_text", "delete_run"])
def test_server_writes_report_each_failure_in_one_line_and_restore_the_environment(monkeypatch, failing):
    import mlflow

    monkeypatch.setattr(mlflow, "MlflowClient", FakeClient)
    monkeypatch.setattr(FakeClient, "failing", failing)
    monkeypatch.setattr(FakeClient, "calls", [])
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    writable, artifacts = store_server._server_writes("http://h:5000", timeout=2.0)
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77" and "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert {t for _, t in FakeClient.calls} == {"6"}  # every call under the short limit
    names = [n for n, _ in FakeClient.calls]
    assert all("\n" not in c.detail for c in (writable, artifacts))
    if failing != "create_run":  # a run was made: it is deleted (tried), after the upload
        assert "delete_run" in names and (
            "log_text" not in names or names.index("log_text") < names.index("delete_run")
        )
    if failing in ("create_run", "log_metric"):
        assert writable.ok is False and f"{failing} refused" in writable.detail
        assert artifacts.ok is None and "not checked" in artifacts.detail
    elif failing == "log_text":
        assert writable.ok is True and artifacts.ok is False and "log_text refused" in artifacts.detail
    else:
        assert writable.ok is True and f"experiment {store_server.DOCTOR_EXPERIMENT}" in writable.detail
        assert ("could not delete it (run r1 stays)" in writable.detail) == (failing == "delete_run")
        assert ("created and deleted a run" in writable.detail) == (failing == "")
        assert artifacts.ok is True and "artifact_uri /nfs/mlruns/1/r1/artifacts" in artifacts.detail
        assert "bypass the server" in artifacts.detail and "see that path" in artifacts.detail


@pytest.mark.slow
def test_a_tracking_server_is_written_to_and_its_artifacts_read_back(tmp_path, monkeypatch, migrated_store):
    """A real ``mlflow server`` (backed by a copy of the session's migrated sqlite store, serving
    artifacts, one worker) started here and stopped by PID: by ``daemons.mlflow_server`` when its
    block ends, and its whole process group by conftest's ``reap`` when the test ends, whatever
    happened (started through ``spawn``)."""
    import shutil
    import subprocess

    import daemons
    from conftest import spawn
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    def spawned(cmd, log, **kw):  # daemons._spawn's process, ended at teardown too
        with open(log, "ab") as f:
            return spawn(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw)

    monkeypatch.setattr(daemons, "_spawn", spawned)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    try:
        shutil.copy(migrated_store, tmp_path / "server.db")
        with daemons.mlflow_server(f"sqlite:///{tmp_path}/server.db", tmp_path / "server", workers=1) as server:
            found = {c.name: c for c in doctor.store(server.uri)}
            assert [found[k].ok for k in ("store_reachable", "store_writable", "store_artifacts")] == [True] * 3, found
            assert "created and deleted a run in experiment plnexp-doctor" in found["store_writable"].detail
            assert found["store_artifacts"].detail.startswith(
                f"{server.uri}: artifact uploaded and read back through the server (artifact_uri mlflow-artifacts:"
            )
            assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
            cl = MlflowClient(server.uri)
            exp = cl.get_experiment_by_name(store_server.DOCTOR_EXPERIMENT)
            assert cl.search_runs([exp.experiment_id]) == []  # the run it made is deleted
            [deleted] = cl.search_runs([exp.experiment_id], run_view_type=ViewType.DELETED_ONLY)
            assert [p.name for p in (tmp_path / "server" / "artifacts").rglob("doctor.txt")] == ["doctor.txt"]

            cl.delete_experiment(exp.experiment_id)  # deleted from the UI: the name stays taken
            assert doctor.store(server.uri)[1].ok is True

            # an experiment whose artifacts go to a path: the client writes there, bypassing the server
            cl.rename_experiment(exp.experiment_id, "plnexp-doctor-before")
            direct = tmp_path / "direct"
            cl.create_experiment(store_server.DOCTOR_EXPERIMENT, artifact_location=str(direct))
            found = {c.name: c for c in doctor.store(server.uri)}
            assert found["store_writable"].ok is True and found["store_artifacts"].ok is True, found
            assert str(direct) in found["store_artifacts"].detail
            assert "artifacts bypass the server" in found["store_artifacts"].detail
            assert [p.name for p in direct.rglob("doctor.txt")] == ["doctor.txt"]
    except daemons.Unavailable as e:
        pytest.skip(f"no mlflow server here: {e}")


def test_slurm_check_without_a_client_is_information(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    [check] = doctor.slurm()
    assert check.ok is None and "no SLURM client here" in check.detail


def test_slurm_check_asks_the_controller(monkeypatch, tmp_path):
    import subprocess

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs plnexp's cluster extra")
    for tool in ("sbatch", "squeue", "scancel"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    answer = lambda code, out, err="": lambda cmd, **kw: subprocess.CompletedProcess(cmd, code, out, err)
    [ok] = doctor.slurm(answer(0, "debug* up 1 idle\ngpu up 2 mix\n"))
    assert ok.ok is True and "partitions: debug*, gpu" in ok.detail
    [down] = doctor.slurm(answer(1, "", "sinfo: error: Unable to contact slurm controller (connect failure)"))
    assert down.ok is None and down.detail.startswith("warning: ") and "Unable to contact slurm" in down.detail


def test_slurm_client_without_the_cluster_extra_is_information(monkeypatch, tmp_path):
    import importlib.util

    from plnexp.system import paths

    for tool in ("sbatch", "squeue", "scancel"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "submitit" in name else real(name, *a))
    [check] = doctor.slurm()
    # the sweeps of this install run here: information, not a failure (doctor's exit stays 0)
    assert check.ok is None and "cluster extra is not installed" in check.detail
    assert "pip install -e '.[cluster]'" in check.detail  # this checkout: an editable install
    monkeypatch.setattr(paths, "CHECKOUT", None)  # a wheel's install: no -e to suggest
    [check] = doctor.slurm()
    assert "pip install 'plnexp[cluster]'" in check.detail and "-e" not in check.detail
