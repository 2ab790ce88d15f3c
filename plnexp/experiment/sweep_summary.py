"""What a sweep shows at its end (:class:`Summary`: the table of its runs, the footer's counts)."""

from __future__ import annotations

import sys
from dataclasses import dataclass


SKIPPED = "SKIPPED"  # the status of a job not run because the store had failed (resume=true runs it)


@dataclass
class Summary:
    status: str
    rows: list  # runner.Row, in job order: one per run (a job of ``replicates=K`` has K runs)
    total: int  # jobs in the grid
    wall_s: float
    parent_id: str
    reused: tuple = ()  # names of the rows a resumed sweep took from earlier runs (not fitted here)
    jobs: tuple = ()  # the job number of each row (empty: one row per job)
    store_error: str = ""  # the line saying the store failed at the close (the rows: what this process saw)

    def _job_of(self) -> list:
        return list(self.jobs) if len(self.jobs) == len(self.rows) else list(range(len(self.rows)))

    @property
    def n_jobs(self) -> int:
        """The jobs of the grid that ran (a job's replicates are one job; the control job is not one
        of the grid: its job number is ``total``, see :func:`plnexp.experiment.sweep_extras.extras`)."""
        return len({j for j in self._job_of() if j < self.total})

    @property
    def n_missing(self) -> int:
        """The jobs of the grid with no run in the store: a job whose process ended before it logged
        one (killed, or failed before its run started). Not one of :attr:`n_failed`'s runs, but a
        sweep with any is not a success: its parent ends FAILED and the command exits 1."""
        return self.total - self.n_jobs

    @property
    def n_control(self) -> int:
        """The control job's runs: none, or one per replicate (``replicates``)."""
        return sum(j == self.total for j in self._job_of())

    @property
    def n_peers(self) -> int:
        """The peers' runs (job numbers past the control's: :func:`plnexp.experiment.sweep_extras.extras`)."""
        return sum(j > self.total for j in self._job_of())

    def _peer_rows(self) -> list:
        return [r for j, r in zip(self._job_of(), self.rows) if j > self.total]

    @property
    def fit_s(self) -> float:
        """Seconds in fits: a job's replicates share one program, so a job counts once (its longest run)."""
        longest: dict = {}
        for job, r in zip(self._job_of(), self.rows):
            if r.name not in self.reused:
                longest[job] = max(longest.get(job, 0.0), r.wall_s)
        return sum(longest.values())

    def count(self, status: str) -> int:
        """Runs with this status."""
        return sum(r.status == status for r in self.rows)

    @property
    def n_failed(self) -> int:
        """The runs that did not finish (including those left RUNNING, see :attr:`n_running`), the
        peers' left out: a peer that fails changes neither the sweep's status nor its exit code."""
        return sum(r.status not in ("FINISHED", SKIPPED) for j, r in zip(self._job_of(), self.rows) if j <= self.total)

    @property
    def n_skipped(self) -> int:
        """The jobs not run because the store had failed (resume=true runs them): not failed, not a success."""
        return self.count(SKIPPED)

    @property
    def n_running(self) -> int:
        """Children left RUNNING when the sweep closed: their owner is alive elsewhere or cannot be
        checked from here (:func:`plnexp.store.end_children`)."""
        return self.count("RUNNING")

    @property
    def parent_status(self) -> str:
        """The parent run's status as the close left it: RUNNING where the store failed then."""
        return "RUNNING" if self.store_error else self.status

    def _running_note(self) -> str:
        n = self.n_running
        return f"{n} left RUNNING (owner alive elsewhere or unknown)" if n else ""

    def runs_note(self) -> str:
        """`` (8 runs)`` when jobs have several runs (replicates), else nothing."""
        return f" ({len(self.rows)} runs)" if len(self.rows) != self.n_jobs + self.n_control + self.n_peers else ""

    def table(self) -> str:
        """One line per job; a sweep with rounds shows the verdict's figures (:mod:`.sweep_table`)."""
        from . import sweep_table

        return sweep_table.table(self.rows) if self.rows else "(no job ran)"

    def footer(self) -> str:
        fit_s = self.fit_s
        outside = f" ({100 * (1 - fit_s / self.wall_s):.0f}% outside)" if 0 < fit_s <= self.wall_s else ""
        earlier = {j for j, r in zip(self._job_of(), self.rows) if r.name in self.reused}
        reused = f" ({len(earlier)} FINISHED earlier)" if earlier else ""
        unit = " runs" if self.runs_note() else ""
        control = " + the control job" if self.n_control else ""
        peers = self._peer_rows()
        if peers:
            bad = [r for r in peers if r.status != "FINISHED"]
            control += f" + {len(peers)} peer run{'s' if len(peers) > 1 else ''}"
            control += f" ({len(bad)} {'/'.join(sorted({r.status for r in bad}))})" if bad else ""
        failed = (
            f"{self.n_failed - self.n_running}{unit} failed, {self._running_note()}"
            if self.n_running
            else f"{self.n_failed}{unit} failed"
        )
        failed += f", {self.n_skipped} skipped" if self.n_skipped else ""
        if self.n_missing and self.status != "KILLED":  # (interrupted: the line says how many not started)
            failed += f", {self.n_missing} without a run"
        return (
            f"{self.n_jobs}/{self.total} jobs{control}{self.runs_note()}{reused}, {failed}; {self.wall_s:.1f} s in the "
            f"sweep, {fit_s:.1f} s in fits{outside}; parent run {self.parent_id} {self.parent_status}"
        )

    def show(self, signame: str | None = None) -> None:
        """Print the table, then the footer (stdout) or, after an interrupt, one line on stderr."""
        print(self.table(), flush=True)
        if signame is not None:
            print(self.interrupted_line(signame), file=sys.stderr, flush=True)
        else:
            print(self.footer(), flush=True)
        if self.store_error:
            print(self.store_error, file=sys.stderr, flush=True)

    def interrupted_line(self, signame: str) -> str:
        running = f", {self._running_note()}" if self.n_running else ""
        done = (
            f"{self.count('FINISHED')} of {len(self.rows)} runs of {self.n_jobs} jobs finished"
            if self.runs_note()
            else f"{self.count('FINISHED')} of {self.total} jobs finished"
        )
        return (
            f"plnexp: interrupted by {signame}: {done}, "
            f"{self.count('KILLED')} killed, {self.count('FAILED')} failed, {self.n_missing} not started{running}; "
            f"parent run {self.parent_id} {'left' if self.store_error else 'closed'} {self.parent_status}"
        )
