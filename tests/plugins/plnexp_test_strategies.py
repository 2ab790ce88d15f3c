"""The test suite's ``blocking`` strategy: scan's fit, which first waits until the test releases it.

Tests of interrupts, SIGKILL, process groups and resume need a job that is *inside its fit* when the
signal comes, for as long as the test needs, without burning CPU. Before its compile and before each
run of the fit, the job writes ``<release>.waiting.<pid>`` (so the test knows it is there, and which process holds it) and
sleeps in short steps until the file ``$PLNEXP_TEST_RELEASE`` exists (a signal lands at once: Python
runs its handler between two sleeps); then it runs scan's compiled fit, so a released job finishes
with a real result.

It comes through plnexp's registry: in the processes the tests start, as the entry point
``blocking`` of the group ``plnexp.strategies`` (this folder, with its ``*.dist-info``, on
``PYTHONPATH``: :func:`conftest.plugin_env`); in the test process itself, by the fixture
``blocking`` (``plnexp.strategies.register``). Chosen with ``strategy.name=blocking``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from plnexp.strategies import NoOptions, Strategy
from plnexp.strategies.scans import scan_program

RELEASE_ENV = "PLNEXP_TEST_RELEASE"


def wait_for_release() -> None:
    release = Path(os.environ[RELEASE_ENV])
    (release.parent / f"{release.name}.waiting.{os.getpid()}").touch()
    while not release.exists():
        time.sleep(0.02)


@dataclasses.dataclass(frozen=True)
class BlockingProgram:
    """scan's program, each run of its fit preceded by :func:`wait_for_release`."""

    inner: object

    def __getattr__(self, name):  # place, initial, split, unbatch: scan's
        return getattr(self.inner, name)

    def call(self, state, data):
        wait_for_release()
        return self.inner.call(state, data)

    def compile(self, state, data):
        wait_for_release()  # inside the fit already, and before scan's compile: a blocked job costs nothing
        compiled = self.inner.compile(state, data)

        def run(state, data):
            wait_for_release()
            return compiled.run(state, data)

        return dataclasses.replace(compiled, run=run)


BLOCKING = Strategy("blocking", NoOptions, lambda pb, n, o: BlockingProgram(scan_program(pb, n, "dict")))
