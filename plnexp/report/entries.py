"""A sweep's runs as the reports read them: one :class:`Entry` per run, the :class:`Report` that
groups them (by data, device, precision and every other config value that varies), and
:func:`load`, which reads them back from MLflow. The reports (:mod:`plnexp.report.summary`, the presets'
own: :mod:`plnexp.report.convergence_report`, :mod:`plnexp.report.rank_report`, :mod:`plnexp.report.tradeoffs`) all read
this one form, and share its helpers: a number in its format (:func:`num`), a Markdown table
(:func:`md_table`), runs by a key (:func:`by`), the fields that vary (:func:`varying`), a median
(:func:`median`), a group's reference run (:func:`run_of`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from ..measure import floor
from ..jobs import provenance
from ..jobs import ranking
from ..jobs import verdicts as V
from .. import store
from ..jobs.config import ConfigError, min_speedup as check_min_speedup
from ..jobs.tags import PEER_TAG

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..store.records import RunRecord

# params that do not define a comparison group: the strategy is what is compared; the data set is
# named by its label (tag ``dataset``); n_iter may differ per strategy (caps), compared at a common length
NOT_GROUPING = ("strategy.", "dataset.", "n_iter_cap")
NOT_GROUPING_KEYS = {"experiment", "tracking_uri", "n_iter", "device", "precision"}
SHORT = {"optimizer.name": "optimizer", "optimizer.lr": "lr", "n_iter_requested": "n_iter asked"}
# What XLA says of a run's compiled program (logged per compiled run; none for eager and PyTorch runs):
# key -> the compiler table's header (CELLS: how its cells are written)
COMPILER = {
    "xla_instructions": "instructions",
    "xla_fusions": "fusions",
    "xla_bytes_per_iter": "bytes/iter",
    "xla_flops_per_iter": "flops/iter",
    "peak_bytes": "peak memory",
    "compile_s": "compile s",
    "trace_s": "trace s",
    "lower_s": "lower s",
    "xla_compile_s": "XLA compile s",
}
DIFFER = 1.5  # tied strategies whose compile time or peak memory differ by this factor or more: the headline says so
DASH = "–"  # a value a run did not log (the compiler table)


@dataclass
class Entry:
    """One run of the sweep, as the report reads it back from MLflow."""

    run_id: str
    name: str
    status: str
    reason: str
    strategy: str
    data: str  # the data set's label, e.g. oaks_x100
    n: int | None
    p: int | None
    device: str
    precision: str
    params: dict
    metrics: dict
    curve: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tags: dict = field(default_factory=dict)
    extra: tuple = ()  # the values of the other grouping params, in Report.extra_keys order
    # filled by compare()
    speedup_eager: float = np.nan
    speedup_scan: float = np.nan
    vs_scan: float = np.nan  # max relative difference of the curve to scan's, at their common length
    elbo_common: float = np.nan  # the ELBO after `common` iterations (when the group's lengths differ)

    def m(self, key: str) -> float:
        return float(self.metrics.get(key, np.nan))

    def number(self, param: str, default: float) -> float:
        """The run's param ``param`` as a number (a strategy's option, its n_iter after any cap); ``default``
        where it has none or it is not a number."""
        try:
            return float(str(self.params.get(param)))
        except ValueError:
            return default

    @property
    def ok(self) -> bool:
        return self.status == "FINISHED" and np.isfinite(self.m("ms_per_iter"))

    @property
    def x_floor(self) -> float:
        """How many times this machine's floor the run's ms/iter is (1 = a hand-fused kernel's best);
        NaN for a run that did not finish or logged no floor (runs older than the floor)."""
        ms, floor = self.m("ms_per_iter"), self.m("floor_ms_per_iter")
        return ms / floor if self.ok and np.isfinite(floor) and floor > 0 else np.nan

    @property
    def control(self) -> bool:
        """The sweep's control job: its reference job run again (an A/A pair, never ranked)."""
        return ranking.is_control(self)

    @property
    def base(self) -> str:
        """The registry name of the run's strategy (the report labels a swept option: ``scan_unrolled unroll=4``)."""
        return str(self.params.get("strategy.name") or self.strategy.split(" ", 1)[0])

    @property
    def peer(self) -> str:
        """The library a peer run fitted with (its :data:`PEER_TAG`: ``pyplnmodels``), "" for plnexp's runs.
        A peer is shown (a row, a curve), never ranked nor compared as a strategy."""
        return self.tags.get(PEER_TAG, "")

    @property
    def label(self) -> str:
        """The strategy as the table names the run: ``scan (control)`` for the control job, ``pyplnmodels
        (peer)`` for a peer run."""
        if self.peer:
            return f"{self.peer} (peer)"
        return f"{self.strategy} (control)" if self.control else self.strategy

    @property
    def floor_bytes(self) -> float:
        """The bytes one iteration must stream at least: the run's logged ``floor_bytes_per_iter``
        (:mod:`plnexp.measure.floor`: its model's arrays at its data's shape); for a run older than that
        metric, what the floor counted then (:data:`plnexp.measure.floor.LEGACY_STREAMED_ARRAYS` n x p arrays
        of the run's precision); NaN where the shape or precision is unknown."""
        logged = self.m("floor_bytes_per_iter")
        if np.isfinite(logged) and logged > 0:
            return logged
        try:
            itemsize = np.dtype(self.precision).itemsize
        except TypeError:
            return np.nan
        return float(floor.LEGACY_STREAMED_ARRAYS * self.n * self.p * itemsize) if self.n and self.p else np.nan

    @property
    def bytes_x_floor(self) -> float:
        """XLA's bytes per iteration over :attr:`floor_bytes` (1: the program streams no more than a
        hand-fused kernel must); NaN where either is missing."""
        b, fb = self.m("xla_bytes_per_iter"), self.floor_bytes
        return b / fb if np.isfinite(b) and np.isfinite(fb) and fb > 0 else np.nan

    @property
    def shape(self) -> str:
        return f"{self.n}×{self.p}" if self.n else "?"

    @property
    def group(self) -> tuple:
        return (self.data, self.device, self.precision, *self.extra)


@dataclass
class Report:
    experiment: str
    parent: RunRecord  # the sweep's parent run
    entries: list[Entry]  # one per job: a job of ``replicates=K`` is its replicate 0 (one program, one timing)
    extra_keys: list[str]
    common: dict = field(default_factory=dict)  # group -> common length, for groups whose lengths differ
    others: list[Entry] = field(default_factory=list)  # replicates 1..K-1 of each job
    min_speedup: float = ranking.MIN_SPEEDUP  # the minimum effect a winner needs (report.min_speedup)
    verdicts: list[V.GroupVerdict] = field(default_factory=list)  # the parent's verdict.json (interleaved rounds)

    def ran(self, preset: str) -> bool:
        """Whether the sweep is ``sweep=<preset>`` (its parent's ``sweep`` tag, else its experiment)."""
        return preset in (self.parent.sweep or "", self.experiment)

    @property
    def grid(self) -> list[Entry]:
        """The entries of the sweep's grid: every job but the control job and the peer runs."""
        return [e for e in self.entries if not e.control and not e.peer]

    @property
    def peers(self) -> list[Entry]:
        """The peer runs (:attr:`Entry.peer`): other libraries' fits, shown beside the grid."""
        return [e for e in self.entries if e.peer]

    @cached_property  # entries are fixed once loaded
    def groups(self) -> dict[tuple, list[Entry]]:
        """plnexp's runs by comparison group (:attr:`Entry.group`); the peer runs are in none."""
        return by([e for e in self.entries if not e.peer], lambda e: e.group)

    def group_label(self, group: tuple) -> str:
        e = self.groups[group][0]
        extra = [f"{SHORT.get(k, k)}={v}" for k, v in zip(self.extra_keys, e.extra)]
        return ", ".join([f"{e.data} ({e.shape})", e.precision, e.device, *extra])

    @property
    def failed(self) -> list[Entry]:
        """Every run that did not finish, a job's other replicates included."""
        return [e for e in self.entries + self.others if e.status != "FINISHED"]

    def main_group(self) -> tuple | None:
        """The group the parent's summary metrics describe: the largest data with a finished run."""
        ok = [g for g, es in self.groups.items() if any(e.ok for e in es)]
        return max(ok, key=lambda g: (self.groups[g][0].n or 0, len(self.groups[g])), default=None)

    @cached_property
    def contenders(self) -> dict[tuple, list]:
        """Per group, its finished runs as :class:`ranking.Contender` (one per program), fastest first."""
        return {g: ranking.contenders(es) for g, es in self.groups.items()}

    def shared(self, group: tuple) -> list:
        """The group's programs that several strategies compiled to."""
        return [c for c in self.contenders[group] if len(c.names) > 1]

    @cached_property
    def contended(self) -> dict[str, list[str]]:
        """Why each contended run's own timings cannot be compared, by run id (:func:`ranking.contention`).
        A group with a verdict of interleaved rounds is judged on its rounds, not on these."""
        return ranking.contention(self.entries)

    @cached_property
    def unjudged_contended(self) -> dict[str, list[str]]:
        """:attr:`contended`, but the runs of groups with a verdict of interleaved rounds."""
        judged = {run for v in self.verdicts for s in v.strategies for run in s.runs}
        return {k: why for k, why in self.contended.items() if k not in judged}

    def verdict_of(self, group: tuple) -> V.GroupVerdict | None:
        """The verdict of the interleaved rounds that timed this group's runs (verdict.json), or None."""
        ids = {e.run_id for e in self.groups[group]}
        return next((v for v in self.verdicts if any(set(s.runs) & ids for s in v.strategies)), None)

    def ranked(self, group: tuple) -> ranking.Ranked:
        """The group's headline and its winner beyond the noise ("" when there is none)."""
        return ranking.rank(self.group_label(group), self.groups[group], self.contended, min_speedup=self.min_speedup)

    def program(self, e: Entry) -> str:
        """The run's program group: the strategies of its group that compiled to its program
        (``a = b = c``), the strategy alone when none shares it, "-" with no XLA program (eager, torch)."""
        if not e.tags.get("hlo_fingerprint"):
            return "-"
        return next((" = ".join(c.names) for c in self.shared(e.group) if e.strategy in c.names), e.strategy)

    def programs(self) -> list[str]:
        """ "a = b = c: one compiled program (...)" for each set of strategies of a group that share one."""
        out = []
        for group in self.groups:
            for c in self.shared(group):
                out.append(
                    f"{' = '.join(c.names)} on {self.group_label(group)}: one compiled program (same "
                    f"optimized HLO, hlo_fingerprint); their timings differ by noise only"
                )
        return out


# ---------------------------------------------------------------- reading the sweep back
def num(x: float | None, fmt: str, missing: str = "-") -> str:
    """``x`` in the format ``fmt``; ``missing`` where it was not measured (None, NaN, infinite)."""
    return fmt.format(x) if x is not None and np.isfinite(x) else missing


def md_table(head: list[str], rows, sep: str = "") -> list[str]:
    """A Markdown table's lines: ``head``, the separator ``sep`` (default: the first column left-aligned,
    the others right-aligned), one line per row of cells."""
    line = lambda cells: "| " + " | ".join(cells) + " |"
    return [line(head), sep or "|---|" + "---:|" * (len(head) - 1), *map(line, rows)]


def by(entries, key) -> dict:
    """``entries`` by ``key(entry)``, in their order."""
    out: dict = {}
    for e in entries:
        out.setdefault(key(e), []).append(e)
    return out


def varying(rows: list[tuple], start: int = 0) -> list[int]:
    """The positions (from ``start``) where the tuples ``rows`` differ."""
    return [i for i in range(start, len(rows[0])) if len({r[i] for r in rows}) > 1] if rows else []


def median(values) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else np.nan


def _entry(run: RunRecord, curve: np.ndarray) -> Entry:
    p = run.params
    return Entry(
        run.run_id,
        run.name,
        run.status,
        run.status_reason,
        p.get("strategy.name", "?"),
        run.dataset or p.get("dataset.name", "?"),
        *run.data_shape,
        p.get("device", "?"),
        p.get("precision", "?"),
        dict(p),
        dict(run.metrics),
        curve,
        dict(run.tags),
    )


def _label_strategies(entries: list[Entry]) -> list[Entry]:
    """A strategy swept over its own options (``strategy.unroll=2,4,8``) is one row per value: the
    options that vary among the runs of one strategy join its label (``scan_unrolled unroll=4``)."""
    for name in {e.strategy for e in entries}:
        runs = [e for e in entries if e.strategy == name]
        varying = _params_varying(runs, lambda k: k.startswith("strategy.") and k != "strategy.name")
        for e in runs:
            e.strategy = " ".join([name, *(f"{k.split('.', 1)[1]}={e.params.get(k)}" for k in varying)])
    return entries


def _params_varying(entries: list[Entry], keep) -> list[str]:
    """The params (those ``keep(key)`` keeps) whose values differ among ``entries``, sorted."""
    keys = sorted({k for e in entries for k in e.params if keep(k)})
    return [k for k in keys if len({e.params.get(k) for e in entries}) > 1]


def _grouping_keys(entries: list[Entry]) -> list[str]:
    varying = _params_varying(entries, lambda k: not k.startswith(NOT_GROUPING) and k not in NOT_GROUPING_KEYS)
    # an optimizer's default learning rate follows the optimizer: no column of its own then
    optimizers = by(entries, lambda e: e.params.get("optimizer.name"))
    if {"optimizer.lr", "optimizer.name"} <= set(varying) and not any(
        _params_varying(runs, lambda k: k == "optimizer.lr") for runs in optimizers.values()
    ):
        varying.remove("optimizer.lr")
    return varying


def find_parent(uri: str, experiment: str | None, run_id: str | None) -> RunRecord:
    """The sweep's parent run that the report is about; ConfigError (one line) when there is none."""
    db = store.open(uri)
    if run_id:
        run = db.run(run_id)
        if run is None or run.deleted:
            raise ConfigError(
                f"--run {run_id}: not found in the store {uri}; allowed values are ids of sweeps' "
                "parent runs (python -m plnexp report without --run takes the newest sweep)"
            )
        parent_id = run.parent_id
        if parent_id:
            raise ConfigError(
                f"--run {run_id}: a job of the sweep whose parent run is {parent_id}; allowed values "
                f"are ids of sweeps' parent runs (--run {parent_id})"
            )
        if not run.is_parent:
            raise ConfigError(
                f"--run {run_id}: a single run, not a sweep; allowed values are ids of sweeps' parent runs"
            )
        return run
    if experiment is not None and db.find_experiment(experiment) is None:
        names = ", ".join(db.experiment_names()) or "none: the store is empty"
        raise ConfigError(
            f"--experiment {experiment}: no such experiment in the store {uri}; allowed values are {names}"
        )
    latest = db.latest_parent(experiment)
    if latest is None:
        where = f"experiment {experiment!r}" if experiment else f"the store {uri}"
        raise ConfigError(f"{where} holds no sweep (no parent run); run `python -m plnexp sweep` first")
    return latest


def _min_speedup(entries: list[Entry]) -> float:
    """The minimum effect the sweep's jobs were run with (their tag, ``report.min_speedup``), else
    :data:`plnexp.jobs.ranking.MIN_SPEEDUP` (runs logged before it)."""
    for e in entries:
        text = e.tags.get(ranking.MIN_SPEEDUP_TAG)
        if text:
            try:
                return check_min_speedup(text)
            except ConfigError:
                continue
    return ranking.MIN_SPEEDUP


def load(uri: str, parent: RunRecord, min_speedup: float | None = None) -> Report:
    """The sweep's runs (:meth:`plnexp.store.Store.sweep`) read back from the store, with their ELBO
    curves, compared; ranked with the minimum effect ``min_speedup`` (None: the sweep's own
    ``report.min_speedup``). ``parent``: the sweep's parent run's record."""
    db = store.open(uri)
    runs = db.sweep(parent)
    every = _label_strategies([_entry(r, db.curve(r.run_id)) for r in runs])
    entries = [e for e in every if provenance.replicate(e.tags) == 0]  # a job's timing, and curve vs scan's
    keys = _grouping_keys([e for e in entries if not e.peer])  # a peer's own params group nothing
    for e in every:
        e.extra = tuple(e.params.get(k, "") for k in keys)
    report = Report(
        db.experiment_name(parent.experiment_id),
        parent,
        entries,
        keys,
        others=[e for e in every if provenance.replicate(e.tags) != 0],
        min_speedup=min_speedup if min_speedup is not None else _min_speedup(entries),
        verdicts=read_verdicts(uri, parent.run_id),
    )
    compare(report)
    return report


def read_verdicts(uri: str, parent_id: str) -> list[V.GroupVerdict]:
    """The parent run's verdict.json (:mod:`plnexp.jobs.verdicts`): [] where it has none (a sweep
    without rounds, or older) or one of another schema (said in one warning line)."""
    text = store.open(uri).artifact(parent_id, V.ARTIFACT)
    if not text:
        return []
    try:
        return V.loads(text)
    except (ValueError, KeyError, TypeError) as e:
        log.warning("plnexp: %s of run %s not read (%s): the jobs' own timings are ranked", V.ARTIFACT, parent_id, e)
        return []


def run_of(entries: list[Entry], strategy: str) -> Entry | None:
    """The finished run of ``strategy`` among ``entries`` (the control job is none): a group's reference."""
    return next((e for e in entries if e.strategy == strategy and e.ok and not e.control), None)


def compare(report: Report) -> None:
    """Speed-ups over eager and scan, agreement with scan's curve, within each group."""
    for group, entries in report.groups.items():
        eager, scan = run_of(entries, "eager"), run_of(entries, "scan")
        lengths = {len(e.curve) for e in entries if e.ok and len(e.curve)}
        if len(lengths) > 1:
            report.common[group] = min(lengths)
        # with a verdict of interleaved rounds, the speed-ups are its paired ratios (measured in the same
        # rounds), else the ratios of the jobs' own medians
        v = report.verdict_of(group)
        paired = v is not None and all(np.isfinite(e.m("paired_ratio")) for e in (eager, scan) if e is not None)
        key = "paired_ratio" if paired else "ms_per_iter"
        for e in entries:
            if not e.ok:
                continue
            ms = e.m(key)
            if eager is not None:
                e.speedup_eager = eager.m(key) / ms
            if scan is not None:
                e.speedup_scan = scan.m(key) / ms
                if len(e.curve) and len(scan.curve):  # over their common length
                    e.vs_scan = provenance.curve_difference(scan.curve, e.curve)[1]
            if group in report.common and len(e.curve):
                e.elbo_common = float(e.curve[report.common[group] - 1])
