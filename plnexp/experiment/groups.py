"""After a sweep's grid, in its driver: each group's programs compiled, then timed in interleaved
rounds, and the verdicts written where the report, the summary and the dashboard read them.

A **group** is the grid's finished jobs that share everything but the strategy: data, model,
optimizer, precision, device, init, gradient, seed, replicates, and the host (the driver's: every
group is timed in this one process, whichever launcher ran the jobs). Its **reference** is scan's
job (else its first: :func:`plnexp.experiment.sweep_extras.control_reference`'s choice). Each group with two
strategies or more is compiled (:func:`plnexp.fitting.rounds.prepare`), then timed in rounds
(:func:`plnexp.fitting.rounds.time_rounds`): at least :func:`plnexp.measure.paired.robust_rounds` kept
rounds (9), then until every program's verdict is decided, ``report.rounds`` rounds at most and
``report.rounds_budget_s`` seconds at most. Per strategy, the paired ratio to the reference, its
interval and verdict (:mod:`plnexp.measure.paired`) go to its run(s) as metrics and tags, and every
group's to the parent as ``verdict.json`` (:mod:`plnexp.jobs.verdicts`).

A job of ``processes`` > 1 (one fit across processes, :mod:`plnexp.experiment.processes`) is never
in a group: its program spans processes that the driver is not, so the rounds leave it out (one
line), it is ranked on its own timings (as every job with ``report.rounds=0``), and the group of the
others is timed as if it were not there (no rounds where fewer than two strategies are left).

Under SLURM each group is timed on its node, in its own task (:func:`judge_groups`; the driver logs the
verdicts: :func:`log_verdicts`). Where nothing can be timed (``report.rounds=0``), nothing
is done and the report ranks the jobs' own timings as before. A group whose rounds fail (a program
that cannot be compiled again, a store that fails) is one warning line: the sweep's status is its
jobs', never the rounds'.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from .. import store
from ..jobs import verdicts as V
from ..jobs.config import Config
from ..jobs.provenance import config_hash
from ..measure import paired
from ..system import interrupts
from ..system.commandline import first_line
from .sweep_extras import reference_of


HOLD_LIMIT_BYTES = 2 << 30  # the grid's programs the driver keeps for its rounds, their arrays at most


@dataclass
class Held:
    """The grid's compiled programs (:class:`plnexp.fitting.prepared.Prepared`) that the driver ran
    itself (Hydra's basic launcher), kept by job number for the rounds: each group is then timed on
    the very programs its jobs ran, without compiling them again. Kept while their arrays (data and
    initial state) stay within ``limit`` bytes; a job past it is compiled again for the rounds."""

    programs: dict = field(default_factory=dict)
    nbytes: int = 0
    limit: int = HOLD_LIMIT_BYTES

    def keeper(self, num: int):
        """What job ``num`` hands its program to (:func:`plnexp.experiment.job_task.run_job`'s ``hold``)."""

        def keep(program) -> None:
            import jax

            leaves = jax.tree_util.tree_leaves((program.arrays, program.state))
            size = sum(int(getattr(a, "nbytes", 0)) for a in leaves)
            if self.nbytes + size <= self.limit:
                self.programs[num], self.nbytes = program, self.nbytes + size

        return keep


@dataclass(frozen=True)
class Member:
    """A finished job of a group: its config, job number and run id(s) (one per replicate)."""

    num: int
    config: Config
    runs: tuple[str, ...]


def group_key(config: Config) -> str:
    """What a group's jobs share: everything of the fit but the strategy (and its n_iter cap)."""
    spec = config.fit_spec()
    return repr(
        (
            config.dataset,
            spec.model,
            spec.optimizer,
            spec.precision.name,
            spec.device,
            spec.init,
            spec.gradient,
            spec.seed,
            spec.replicates,
        )
    )


def finished_members(record, configs: Mapping[int, Config]) -> list[Member]:
    """The jobs of ``configs`` (by job number) whose runs (every replicate's) FINISHED in this sweep,
    in job order."""
    runs: dict[int, list] = {}
    db = store.open(record.uri)
    for r in db.children(record.parent):
        if r.job is not None and r.job in configs:
            runs.setdefault(r.job, []).append(r)
    for d in getattr(record, "reused", ()):  # a resumed sweep's jobs that earlier runs answer: timed too
        if d.job in configs and d.job not in runs:
            found = (db.run(i) for i in d.run_ids or (d.run_id,))
            runs[d.job] = [r for r in found if r is not None]
    out = []
    for num, rs in sorted(runs.items()):
        k = configs[num].replicates
        mine = config_hash(configs[num])  # (as the sweep ran it, as_study: compile_cache is not hashed)
        if len(rs) == k and all(r.status == "FINISHED" and r.config_hash == mine for r in rs):
            rs = sorted(rs, key=lambda r: r.replicate)
            out.append(Member(num, configs[num], tuple(r.run_id for r in rs)))
    return out


def partition(items: Sequence, config_of=lambda item: item.config) -> tuple[list[list], list]:
    """``items`` (members, job specs: anything with a config) by group, in first appearance order:
    the groups of two strategies or more (what rounds compare), and every other item."""
    by: dict[str, list] = {}
    for item in items:
        by.setdefault(group_key(config_of(item)), []).append(item)
    compared: list[list] = []
    alone: list = []
    for xs in by.values():
        if len({repr(config_of(x).strategy.as_dict()) for x in xs}) > 1:
            compared.append(xs)
        else:
            alone.extend(xs)
    return compared, alone


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]  # a program that sat out a round has none there
    return statistics.median(xs) if xs else float("nan")


def judge(names, fingerprints, runs, rounds, per_iter, ref: int, label: str, min_effect: float) -> V.GroupVerdict:
    """The group's verdict from its rounds (:class:`plnexp.fitting.rounds.Rounds`): per strategy
    its ms/iter (``per_iter[i]``: the divisor of program i's round time) and paired ratio, per
    program (one fingerprint) the ratios pooled."""
    ms = [[1e3 * t / per_iter[i] for t in rounds.column(i)] for i in range(len(names))]
    need = paired.min_rounds()
    kept, dropped = len(rounds.kept), rounds.n_dropped
    results = []
    for i, name in enumerate(names):
        if i == ref:
            r = paired.Ratio(1.0, 1.0, 1.0, kept, V.REFERENCE)
        else:
            r = paired.paired_ratio(ms[i], ms[ref], min_effect)
        results.append(
            V.StrategyResult(
                name, runs[i], fingerprints[i], _median(ms[i]), r.median, r.low, r.high, r.verdict, r.n, dropped
            )
        )
    programs = []
    by_fp: dict[str, list[int]] = {}
    for i, fp in enumerate(fingerprints):
        by_fp.setdefault(fp or f"-{i}", []).append(i)
    for idx in by_fp.values():
        members = tuple(dict.fromkeys(names[i] for i in idx))
        if ref in idx:
            programs.append(V.ProgramResult(members, fingerprints[ref], 1.0, 1.0, 1.0, V.REFERENCE))
            continue
        # the names of one program timed once share one column: counted once, not once per name
        cols = list(dict.fromkeys(tuple(t if math.isfinite(t) else None for t in ms[i]) for i in idx))
        pooled_t = [math.nan if t is None else t for col in cols for t in col]
        pooled_r = [t for _ in cols for t in ms[ref]]
        r = paired.paired_ratio(pooled_t, pooled_r, min_effect)
        programs.append(V.ProgramResult(members, fingerprints[idx[0]], r.median, r.low, r.high, r.verdict))
    note = ""
    if kept < need:
        note = f"too few clean rounds: {kept} kept of {kept + dropped} (an interval needs {need}): nothing decided"
    return V.GroupVerdict(
        label,
        names[ref],
        kept,
        dropped,
        min_effect,
        paired.CONFIDENCE,
        rounds.seconds,
        tuple(results),
        tuple(programs),
        tuple(why for why in rounds.dropped if why),
        note,
    )


def _time_group(members: Sequence[Member], held: Held | None = None) -> V.GroupVerdict:
    from ..fitting import rounds as R
    from .runner import load_data

    first = members[0].config
    ref = reference_of([m.config for m in members])  # (its first scan job, else its first)
    datas = [load_data(ds) for ds in first.replicate_datasets()]
    label = f"{first.dataset.label} ({datas[0].n}×{datas[0].p}), {first.precision.name}, {first.device.value}"
    t0 = time.monotonic()
    programs = []
    for m in members:
        kept = held.programs.get(m.num) if held is not None else None
        if kept is not None:  # the job's own program: one untimed run again (eager's primitives, caches)
            kept.run()
            kept.cpu_s.clear()
            programs.append(kept)
        else:
            data = datas if len(datas) > 1 else datas[0]
            programs.append(R.prepare(m.config.strategy.name, data, m.config.fit_spec()))
    compiled_s = time.monotonic() - t0
    per_iter = [p.n_iter * m.config.replicates for p, m in zip(programs, members)]  # a batch: its share per fit
    names = ["-".join([m.config.strategy.name, *m.config.strategy.name_parts()]) for m in members]
    rep = first.report
    min_effect = rep.min_speedup

    fingerprints = [p.fingerprint for p in programs]
    # one program, timed once: strategies whose programs have one fingerprint (and length) are one
    # compiled program, so each round runs it once and every name of it gets its figures
    first_of: dict[tuple, int] = {}
    timed_as = []  # member i -> the index of the program timed for it
    for i, (fp, n) in enumerate(zip(fingerprints, per_iter)):
        timed_as.append(first_of.setdefault((fp, n), i) if fp else i)
    order = list(dict.fromkeys(timed_as))  # the programs timed, by member index
    position = {i: k for k, i in enumerate(order)}

    def members_of(rounds) -> R.Rounds:
        """The rounds of the programs timed, as every member's (a program's names share its column)."""
        pick = [position[timed_as[i]] for i in range(len(members))]
        return replace(
            rounds,
            names=tuple(names),
            times=tuple(tuple(row[k] for k in pick) for row in rounds.times),
            cpu=tuple(tuple(row[k] for k in pick) for row in rounds.cpu),
        )

    def settled(rounds) -> set[int]:
        """The programs timed whose every name's verdict stands (the reference's never: every pair needs it)."""
        v = judge(names, fingerprints, [m.runs for m in members], members_of(rounds), per_iter, ref, label, min_effect)
        open_ = {timed_as[i] for i, s in enumerate(v.strategies) if s.verdict == "unresolved"} | {timed_as[ref]}
        return {position[i] for i in order if i not in open_}

    rounds = members_of(
        R.time_rounds(
            [programs[i] for i in order],
            # at least the rounds whose interval leaves out the extreme ratio on each side (9): one round
            # hit by a burst cannot block a verdict (paired.robust_rounds); decisions from 6 rounds on
            min_rounds=paired.robust_rounds(),
            max_rounds=max(rep.rounds, paired.robust_rounds()),
            budget_s=rep.rounds_budget_s,
            decided=lambda rounds: len(settled(rounds)) == len(order) - 1,
            settled=settled,
            settle_after=paired.min_rounds(),  # eager's 5x stands on 6 rounds: it sits out from then on
            seed=first.seed,
        )
    )
    v = judge(names, fingerprints, [m.runs for m in members], rounds, per_iter, ref, label, min_effect)
    cpu = [_median([1e3 * c / n for c in rounds.cpu_column(i)]) for i, n in enumerate(per_iter)]
    strategies = tuple(replace(s, cpu_ms_per_iter=c) for s, c in zip(v.strategies, cpu))
    cap = max(rep.rounds, paired.robust_rounds())  # (what the report says would decide an unresolved verdict)
    return replace(
        v, strategies=strategies, extra={"compiled_s": compiled_s}, budget_s=rep.rounds_budget_s, max_rounds=cap
    )


def judge_groups(record, configs, held: Held | None = None) -> list[V.GroupVerdict]:
    """Each group of the sweep's finished jobs among ``configs`` (a list in job order, or a mapping
    job number -> config: a SLURM job's own group) timed in rounds here, one progress line per
    group; nothing logged. Each group's programs are let go once it is timed."""
    by_num = dict(enumerate(configs)) if isinstance(configs, Sequence) else dict(configs)
    if not by_num or next(iter(by_num.values())).report.rounds == 0:
        return []
    try:
        members = finished_members(record, by_num)
    except Exception as e:  # noqa: BLE001 - the store failed: the jobs' own timings stand
        _warn(f"cannot read the sweep's runs for its rounds ({first_line(e)}): the jobs' own timings stand")
        return []
    across = [m for group in partition(members)[0] for m in group if m.config.processes > 1]
    if across:  # their programs span processes this one is not: never timed here (the module docstring)
        jobs = ", ".join(str(m.num + 1) for m in across)
        print(
            f"[rounds] job(s) {jobs} of processes > 1 left out: a fit across processes does not run in this "
            "process; their own timings stand",
            flush=True,
        )
        members = [m for m in members if m.config.processes == 1]
    out = []
    for group in partition(members)[0]:
        head = f"[rounds] {len(group)} programs of {group[0].config.dataset.label}"
        print(f"{head} ...", end="", flush=True)
        try:
            v = _time_group(group, held)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the line ends before the interrupt's own
            print(" interrupted", flush=True)
            raise
        except Exception as e:  # a program that cannot be compiled again: said, the sweep goes on
            if interrupts.pending() is not None:
                raise
            print(" FAILED", flush=True)
            _warn(f"rounds of {head.removeprefix('[rounds] ')} failed ({first_line(e)}): the jobs' own timings stand")
            continue
        finally:
            if held is not None:
                for m in group:
                    held.programs.pop(m.num, None)
        dropped = f", {v.dropped} dropped" if v.dropped else ""
        print(
            f" ready in {v.extra.get('compiled_s', 0.0):.1f} s, {v.rounds} rounds{dropped} in {v.seconds:.1f} s",
            flush=True,
        )
        out.append(v)
    return out


def log_verdicts(record, verdicts: Sequence[V.GroupVerdict]) -> None:
    """The groups' verdicts to the store: each run's figures and tags, the parent's ``verdict.json``
    and the experiment's study view; a store that fails: the headlines printed instead."""
    if not verdicts:
        return
    try:
        with interrupts.deferred():
            for v in verdicts:
                for s in v.strategies:
                    for run_id in s.runs:
                        store.add_results(record.uri, run_id, s.metrics(), v.run_tags(s))
            store.log_text(record.uri, record.parent_id, V.dumps(list(verdicts)), V.ARTIFACT)
        title = f"sweep {record.name}, parent run {record.parent_id}"
        store.show_sweep(record.uri, record.parent.experiment_id, record.parent_id, title)
    except Exception as e:  # noqa: BLE001 - the store failed: the verdict is printed, not kept
        _warn(f"cannot write the rounds' verdicts to the store ({first_line(e)})")
        for v in verdicts:
            print(v.headline(), flush=True)


def _warn(text: str) -> None:
    print(f"plnexp: warning: {text}", file=sys.stderr, flush=True)
