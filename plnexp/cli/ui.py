"""``python -m plnexp ui [mlflow ui options]``: mlflow ui on the project's store (:func:`ui`), its
address checked before anything starts (:func:`ui_address`, :func:`check_port_free`: one line, exit
2), the store and the artifacts' folder given through its environment (:func:`ui_environment`),
served until it stops (:func:`_serve`). The study view it opens on: :mod:`plnexp.cli.study`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from pathlib import Path

from ..experiment import plan
from ..system import credentials
from .. import store
from ..jobs import config as C
from ..system.redact import redact_text
from ..system.commandline import Parser, UsageError, fail

UI_HOST, UI_PORT = "127.0.0.1", 5000  # mlflow ui's defaults (plnexp names its host)
PORTS = "integers from 1 to 65535"


def ui_address(args: list[str]) -> tuple[str, int]:
    """The host and port that ``python -m plnexp ui [args]`` serves on (``--host``/``-h``, else
    127.0.0.1; ``--port``/``-p``, else 5000; the last given, as mlflow ui's click takes it); a port
    out of range is one :class:`ConfigError` line."""
    p = Parser("python -m plnexp ui [--host HOST] [--port N] [mlflow ui options]", add_help=False)
    p.add_argument("-h", "--host", default=UI_HOST)
    p.add_argument("-p", "--port", default=str(UI_PORT))
    ns, _ = p.parse_known_args(args)  # the other options are mlflow ui's
    port = int(ns.port) if ns.port.isdigit() else 0
    if not 1 <= port <= 65535:
        raise C.ConfigError(f"--port {ns.port}: allowed values are {PORTS}")
    return ns.host, port


def check_port_free(host: str, port: int) -> None:
    """The port is free on ``host``: a socket bound to it, as the server binds it (SO_REUSEADDR, so that
    a port left in TIME_WAIT by a server just stopped counts as free), and closed at once; else one
    :class:`ConfigError` line naming the port (another server, a dashboard already running)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            free = ""
            with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as other:
                other.bind((host, 0))
                free = f", e.g. --port {other.getsockname()[1]}"
            why = (
                "in use (another server, or a dashboard already running)"
                if e.errno == errno.EADDRINUSE
                else e.strerror or e
            )
            raise C.ConfigError(
                f"--port {port}: {host}:{port} cannot be served: {why}; allowed values are free ports{free}"
            ) from None


def ui(args: list[str]) -> int:
    """``plnexp ui [mlflow ui options]``: mlflow ui on the project's store (its artifacts under the
    outputs folder), served until it stops. A bad ``--port``, a port already taken or an outputs folder
    that cannot be written: one line, exit 2, nothing started. mlflow ui ending with an error: one
    line, exit 1; Ctrl-C or SIGTERM (passed on to it): exit 130 or 143."""
    served = "--help" not in args  # mlflow ui's help: nothing is served
    try:
        out = plan.check_outputs()
        if served:
            host, port = ui_address(args)
            check_port_free(host, port)
    except (C.ConfigError, UsageError) as e:
        return fail(e)
    uri = store.tracking_uri(None)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--host", UI_HOST, *args]
    # the store and the artifacts' folder through mlflow's own environment variables, never its
    # argv: every local user reads a process's command line (/proc/PID/cmdline, ps)
    env = {**os.environ, **ui_environment(uri, out)}
    # MLflow 3's server also starts its job runner (seven huey_consumer processes, each importing
    # MLflow: ~20 s of CPU and 1.7 GB measured here) for GenAI jobs (scorers, evaluations) that a
    # dashboard of plnexp's runs never runs; off unless the user set it
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    print(f"{' '.join(cmd)} (store {redact_text(uri)})", flush=True)
    if served:  # the study's address, and a browser on it where one can be shown
        from . import study

        url, what = study.address(uri, host, port)
        print(f"open {url}\n  ({what})", flush=True)
        study.open_when_up(url, f"{study.base(host, port)}/health")
    return _serve(cmd, out, env)


UI_STORE_VAR, UI_ARTIFACTS_VAR = "MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"


def ui_environment(uri: str, out: Path) -> dict[str, str]:
    """What ``mlflow ui`` is given through its environment: the store (``--backend-store-uri``'s
    variable) and the artifacts' folder under the outputs folder (``--artifacts-destination``'s); a
    credential of the store stays in the variables its client reads (credentials.split_uri)."""
    address, secret = credentials.split_uri(uri)
    return {UI_STORE_VAR: address, UI_ARTIFACTS_VAR: (out / "mlartifacts").as_uri(), **secret}


def _serve(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> int:
    """Run the server ``cmd`` in ``cwd`` until it ends; its exit status as plnexp's (see :func:`ui`).
    A Ctrl-C in the terminal reaches the server too (one process group), and plnexp waits for it to
    stop (passing the SIGINT on where it was plnexp's alone); a SIGTERM is passed on."""
    import subprocess

    proc = subprocess.Popen(cmd, cwd=cwd, env=env)
    stopped: list[int] = []

    def pass_on(signum, frame):
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    try:
        previous = signal.signal(signal.SIGTERM, pass_on)
        handled = True
    except ValueError:  # not the main thread (a caller in Python): SIGTERM stays the caller's
        previous, handled = None, False
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                stopped.append(signal.SIGINT)
                try:
                    proc.wait(5)  # the terminal's Ctrl-C reached the server as well
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGINT)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, previous)
    if stopped:
        print(
            f"plnexp: interrupted by {signal.Signals(stopped[0]).name}: mlflow ui stopped", file=sys.stderr, flush=True
        )
        return 128 + stopped[0]
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"plnexp: error: mlflow ui {how} (its own output above says why)", file=sys.stderr, flush=True)
        return 1
    return 0
