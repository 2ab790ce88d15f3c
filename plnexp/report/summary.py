"""``python -m plnexp report [--experiment NAME] [--run PARENT_ID] [--out DIR] [--min-speedup X]``: what a sweep shows.

Reads a sweep's runs back from MLflow (never from a process's memory: the children of the parent
run, and for a resumed sweep the runs it reused, see :meth:`plnexp.store.Store.sweep`) and writes
into ``<outputs>/reports/<experiment>/<parent run id>/`` (or ``--out``), whole or not at all:

- ``report.html`` (:mod:`plnexp.report.document`): the verdict's plain headline first, one compact table
  per group ranked as the verdict ranks (:mod:`plnexp.report.speed`, :mod:`plnexp.report.table`),
  the figures inline; ``report.md`` the same as Markdown;
- ``report.csv``: every figure, one row per strategy x data size x device x precision (x every
  other config value that varies across the sweep), with compile time, steady run time, ms per
  iteration and its spread, the number of timed runs, the program's fingerprint, whether the
  timings were contended, speed-up over ``eager`` and over ``scan`` in the same group, how many
  times the floor of the machine that ran it its ms/iter is (``× floor``, :mod:`plnexp.measure.floor`), the final
  ELBO and the largest relative difference of the run's ELBO curve to ``scan``'s (do the
  strategies agree?); the sweep's control job (:mod:`plnexp.experiment.sweep`) is a row of its own, marked
  ``(control)``, never ranked. Beside it, per group, the **compiled programs** (one row per
  ``hlo_fingerprint``: the strategies that compiled to it, XLA's instructions and fusions, bytes
  and flops per iteration, bytes per iteration over the floor's bytes, peak memory, compile time
  split into trace, lower and XLA; "–" where a run logged none: eager, PyTorch, older runs). Its
  summary says per group which strategy is fastest beyond the noise and the minimum effect
  (``--min-speedup X``, else the sweep's ``report.min_speedup``), or which are tied within it and
  what still differs between them beyond :data:`DIFFER` (compile time, peak memory)
  (:mod:`plnexp.jobs.ranking`);
- ``elbo_curves.png``, ``timings.png``, ``bytes.png`` (ms/iter against XLA's bytes per iteration,
  one point per program, when the runs logged it) and, when the sweep varies the data size,
  ``scaling.png``.

The same files go to the parent run's artifacts (``report/``), with the verdict's summary metrics on
the parent (:mod:`plnexp.report.parent`) and a description. Runs that stopped at different lengths (a cap, an early stop) are compared at their
common length, and the table says so.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from ..jobs import provenance
from ..jobs import ranking
from .. import store
from ..jobs.config import ConfigError, min_speedup as check_min_speedup, outputs_dir
from ..system.commandline import Parser, UsageError, fail
from ..system.redact import redact_text
from . import convergence_report, headline, rank_report, table, tradeoffs
from . import document as markup
from .compiler_table import compiler_table, differences
from .csv_table import csv_text
from .entries import DASH, SHORT, md_table, num
from .entries import Entry as Entry, Report as Report, compare as compare, load as load  # re-exported
from .entries import find_parent
from .glossary import glossary
from .parent import metrics_and_tags  # the verdict's figures (or, without rounds, the winner's), never a best-of
from .sweep_figures import figures


def notes(report: Report) -> list[str]:
    lines = list(report.programs())
    for e in report.entries:
        if e.control:
            o = ranking.original(e, report.groups[e.group]) if e.ok else None
            if o is not None:
                a, b = e.m("ms_per_iter"), o.m("ms_per_iter")
                pair = f"{100 * (max(a, b) / min(a, b) - 1):.1f}% apart from {o.name}'s (an A/A pair of the noise estimate)"
            else:
                pair = "no A/A pair (it or the job it repeats did not finish)"
            job = e.tags.get(ranking.CONTROL_OF_TAG, "")
            which = f"job {int(job) + 1}" if job.isdigit() else "its reference job"
            lines.append(f"{e.name}: the control job, {which} run again after the grid: {pair}")
    for e in report.entries:
        for why in report.contended.get(e.run_id, []):
            lines.append(f"{e.name}: timings contended: {why}")
    for group, k in report.common.items():
        short = sorted({f"{e.strategy} ({len(e.curve)})" for e in report.groups[group] if e.ok})
        lines.append(
            f"{report.group_label(group)}: the runs stopped at different lengths ({', '.join(short)}); "
            f"their curves and the 'ELBO at common length' column compare at iteration {k}."
        )
    for e in report.failed:
        lines.append(f"{e.name}: {e.status}{' (' + e.reason + ')' if e.reason else ''}")
    return lines


def summary_lines(report: Report) -> list[str]:
    """The terminal summary: per group, the fastest strategy beyond the noise or those tied within
    it (:func:`ranking.rank`), and whether the curves agree; then contention and failures."""
    lines = [
        line for group in report.groups for line in headline.of_group(report, group) or [ranked_line(report, group)]
    ]
    lines += tradeoffs.lines(report)
    lines += convergence_report.lines(report)
    lines += rank_report.lines(report)  # the rank BIC and ICL pick (PLN-PCA runs of 2+ ranks)
    if report.unjudged_contended:  # (a group with a verdict of rounds is judged on them, not on its jobs' timings)
        lines.append(
            f"timings contended in {len(report.unjudged_contended)} of {len(report.entries)} runs (see the report's "
            f"notes): do not compare them; {ranking.CLEAN}"
        )
    if report.others:
        lines.append(replicates_line(report))
    failed = report.failed
    grid = report.grid
    total = report.parent.jobs or len(grid)
    runs = report.entries + report.others
    status = Counter(e.status for e in runs)
    counts = [f"{status[s]} {s.lower()}" for s in ("FAILED", "KILLED", "RUNNING") if status[s]]
    missing = max(total - len(grid), 0)
    counts += [f"{missing} not started"] if missing else []
    control = " + the control job" if any(e.control for e in report.entries) else ""
    control += f" + {len(report.peers)} peer run{'s' if len(report.peers) > 1 else ''}" if report.peers else ""
    done = (
        f"{len(runs) - len(failed)} of {len(runs)} runs ({len(grid)} of {total} jobs{control}, "
        f"{len(runs) // max(len(report.entries), 1)} replicates each) finished"
        if report.others
        else f"{sum(e.status == 'FINISHED' for e in grid)} of {total} jobs{control} finished"
    )
    lines.append(
        done
        + (f" ({', '.join(counts)})" if counts else "")
        + (": " + ", ".join(f"{e.name} ({e.status})" for e in failed) if failed else "")
    )
    return lines


def ranked_line(report: Report, group: tuple) -> str:
    """The summary's line of a group without interleaved rounds (those have their plain headline:
    :func:`plnexp.report.headline.of_group`): the jobs' own timings ranked (:meth:`Report.ranked`,
    with what still differs between tied strategies: :func:`plnexp.report.compiler_table.differences`); then whether the
    curves agree with scan's."""
    ranked = report.ranked(group)
    differ = differences(report, group, ranked.tied) if ranked.tied else ""
    agree = [e.vs_scan for e in report.groups[group] if np.isfinite(e.vs_scan) and not e.control]
    agreement = f"; curves within {max(agree):.1e} of scan's" if agree else ""
    return ranked.line + differ + agreement


def replicates_line(report: Report) -> str:
    """A sweep of ``replicates=K``: what the ranking shows of it, and the spread of the replicates'
    final ELBOs per job (their K initial states or data sets)."""
    spans = []
    for e in report.grid:
        mine = [o for o in report.others if provenance.batch_key(o.tags) == provenance.batch_key(e.tags)]
        finals = [x.m("final_elbo") for x in [e, *mine] if x.status == "FINISHED" and np.isfinite(x.m("final_elbo"))]
        if finals:
            spans.append(f"{e.strategy} {min(finals):.7g} to {max(finals):.7g} ({len(finals)} finished)")
    return (
        "replicates: each job's fits ran in one program; the ranking and the curve agreement above are "
        "replicate 0's (its run_s the batch's share); final ELBO across replicates: " + "; ".join(spans)
    )


def precision_table(report: Report) -> list[str]:
    """When the sweep varies the precision: one row per finished run, the float32 and float64 runs of
    one config side by side, with its final ELBO as the float64 ELBO at its final parameters
    (``loglik``: what the fit reached, whatever its precision), the compiled ELBO beside it
    (``final_elbo``: the program's own value, off from ``loglik`` by its precision's rounding),
    their difference, the float64 ELBO relative to the float64 run's of the same config, and the gap to
    the data set's optimum (``gap_final_rel``) where logged; the peer runs after. [] otherwise."""
    precisions = sorted({e.precision for e in report.grid})
    if precisions != ["float32", "float64"]:
        return []
    runs = [e for e in report.grid if e.ok]
    key = lambda e: (e.strategy, e.data, e.shape, e.device, *map(str, e.extra))
    f64 = {key(e): e.m("loglik") for e in runs if e.precision == "float64"}
    extra = [SHORT.get(k, k) for k in report.extra_keys]
    head = ["strategy", "data", "n×p", "device", *extra, "precision"]
    head += ["final ELBO (float64 at its parameters)", "compiled final ELBO", "compiled − float64 (nats)"]
    head += ["vs the float64 run (rel.)", "gap to the optimum (rel.)"]
    rows = []
    for e in sorted(runs, key=lambda e: (key(e), e.precision)) + [e for e in report.peers if e.ok]:
        loglik, compiled, base = e.m("loglik"), e.m("final_elbo"), f64.get(key(e), np.nan)
        versus = (loglik - base) / abs(base) if e.precision != "float64" and not e.peer and base else np.nan
        cells = [e.label, e.data, e.shape, e.device, *map(str, e.extra), e.precision]
        cells += [num(loglik, "{:,.1f}"), num(compiled, "{:,.1f}"), num(compiled - loglik, "{:,.1f}")]
        rows.append([*cells, num(versus, "{:+.2e}"), num(e.m("gap_final_rel"), "{:.2e}", "not logged")])
    return md_table(head, rows, "|---|---|---:|---|" + "---|" * (len(extra) + 1) + "---:|" * 5)


# ---------------------------------------------------------------- writing
def document(report: Report, images: list[str]) -> list[tuple]:
    """The report as one document (:mod:`plnexp.report.document`), rendered to report.md and report.html."""
    p = report.parent
    doc: list[tuple] = [
        ("h", 1, f"Sweep {p.sweep or '?'} ({report.experiment})"),
        (
            "p",
            f"Parent run `{p.run_id}` ({p.status}); command `python -m plnexp {p.command or 'sweep'}`; {len(report.entries)} runs.",
        ),
        ("h", 2, "Verdict"),
        ("ul", summary_lines(report), "verdict"),
        ("h", 2, "Runs", "Strategies, fastest first"),
        (
            "p",
            "Each group's strategies fastest first, as its verdict ranks them; every ratio is time ÷ the reference's "
            "(below 1: faster). report.csv holds every figure of every run, in this order.",
        ),
        *(("table", report.group_label(g), table.head(report, g), table.rows(report, g)) for g in report.groups),
    ]
    compiled = compiler_table(report)
    if compiled:
        lines = [
            "Compiled programs, one row per program (hlo_fingerprint), fastest first as the verdict ranks them "
            "(ms/iter: the interleaved rounds' where the group had them): what XLA says of each "
            "(bytes and flops per iteration from its cost analysis, peak memory from its memory analysis; the "
            "median over the program's runs); 'bytes/iter ÷ floor bytes' is its bytes over the bytes an "
            "iteration must stream at least (the floor's arrays, as the run logged them); compile time split into trace, lower and XLA's compile. "
            f"'{DASH}': not logged (eager and PyTorch have no XLA program; runs older than these figures).",
            "",
            *compiled,
        ]
        doc.append(("md", lines))
    precision = precision_table(report)
    if precision:
        lines = [
            "Final ELBO per precision, each run after its last step: the float64 ELBO at the run's final "
            "parameters (what the fit reached, the same yardstick for every precision), the ELBO its compiled "
            "program computed (in its own precision), their difference (that precision's rounding: a float32 "
            "run far from the float64 run on the float64 ELBO ended elsewhere), the float64 ELBO relative to the float64 run's of the same config, and the gap "
            "to the data set's optimum (see Convergence).",
            "",
            *precision,
            "",
        ]
        doc.append(("md", lines))
    doc.append(("md", convergence_report.markdown(report) + rank_report.markdown(report)))
    extra = notes(report)
    if extra:
        doc += [("p", "Notes:"), ("ul", extra, "small")]
    return [*doc, ("figures", images), ("h", 2, "Glossary"), *(("p", g) for g in glossary(report) if g)]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "_"


def default_dir(report: Report) -> Path:
    return outputs_dir() / "reports" / _safe(report.experiment) / report.parent.run_id


def write(report: Report, out: Path) -> list[str]:
    """Write the report's files into ``out`` whole or not at all: built in a temporary folder beside
    it, then put in place of any earlier report there. Returns the file names."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        images = figures(report, tmp)
        # credentials masked again: a run logged before plnexp masked them still holds them
        doc = document(report, images)
        (tmp / "report.md").write_text(redact_text(markup.markdown(doc)))
        (tmp / "report.csv").write_text(redact_text(csv_text(report)))
        (tmp / "report.html").write_text(redact_text(markup.page(doc, tmp)))
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, old / "report")
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ["report.html", "report.md", "report.csv", *images]


def parent_metrics(report: Report, files: list[str]) -> tuple[dict, dict]:
    """The parent run's summary metrics and tags (about :meth:`Report.main_group`); ``files``: the
    report's files, named in the run's description."""
    metrics, tags = metrics_and_tags(report)
    lines = summary_lines(report)
    note = (
        f"**Sweep `{report.parent.sweep or '?'}`**: {len(report.grid)} runs, one per job"
        f"{', and the control job (its reference job again: an A/A pair)' if any(e.control for e in report.entries) else ''} "
        f"(expand this run's + to see them, or sort by start time).\n\n"
        + "\n".join(f"- {s}" for s in lines)
        + "\n\nTo read it: open `report/report.html` in this run's artifacts (the verdict, one table, the "
        "figures); in the runs table, `paired_ratio` (time ÷ the reference's, in the same interleaved rounds) and "
        "its interval rank the child runs, `ms_per_iter` is each job's own timed run (one measurement, not a "
        "ranking); the `gap_rel_log10` chart shows each run's convergence. "
        "This run's artifacts hold the report: " + ", ".join(f"`report/{f}`" for f in files) + "."
    )
    tags["mlflow.note.content"] = note
    return metrics, tags


def build(
    uri: str,
    experiment: str | None = None,
    run_id: str | None = None,
    out: Path | None = None,
    *,
    attach: bool = True,
    min_speedup: float | None = None,
) -> tuple[Report, Path, list[str]]:
    """Read, write, and (``attach``) log onto the parent run; returns the report, its folder, its files.
    ``min_speedup``: the minimum effect a winner needs (None: the sweep's ``report.min_speedup``)."""
    report = load(uri, find_parent(uri, experiment, run_id), min_speedup)
    if not report.entries:
        raise ConfigError(f"sweep {report.parent.run_id}: no run to report on (its jobs never started)")
    folder = Path(out) if out is not None else default_dir(report)
    files = write(report, folder)
    if attach:
        store.log_report(uri, report.parent.run_id, folder, *parent_metrics(report, files))
        # the dashboard's experiment description: the study's link, then this sweep's plain headline
        store.show_headline(uri, report.parent.experiment_id, summary_lines(report)[:12])
    return report, folder, files


def show(report: Report, folder: Path, files: list[str]) -> None:
    """The terminal's answer: the verdict's plain headline first, then each group's strategies
    fastest first as the verdict ranks them (:mod:`plnexp.report.table`), then where the report is."""
    for line in summary_lines(report):
        print(redact_text(line), flush=True)
    for group in report.groups:
        if report.verdict_of(group) is not None:
            print(f"\n{redact_text(report.group_label(group))}, fastest first (the verdict's figures):", flush=True)
            print(redact_text(table.text(report, group)), flush=True)
    print(f"report: {folder} ({', '.join(files)}), also on parent run {report.parent.run_id}", flush=True)


# ---------------------------------------------------------------- the command
USAGE = "usage: python -m plnexp report [--experiment NAME] [--run PARENT_ID] [--out DIR] [--min-speedup X]"


def parser() -> Parser:
    """``report``'s arguments (:mod:`plnexp.cli.parser` names the command)."""
    p = Parser(
        USAGE.removeprefix("usage: "),
        __doc__.split("\n\n", 1)[1],
        unknown="{arg}: unknown argument; allowed are {allowed}",
    )
    p.add_argument("--experiment", metavar="NAME", help="the newest sweep of this experiment")
    p.add_argument("--run", dest="run_id", metavar="PARENT_ID", help="this sweep (its parent run)")
    p.add_argument("--out", metavar="DIR", help="the folder to write into")
    p.add_argument("--min-speedup", dest="min_speedup", metavar="X", help="the minimum effect a winner needs (>= 1)")
    return p


def parse(args: list[str]) -> dict | None:
    """``--key value`` or ``--key=value`` for experiment, run, out, min-speedup (a number >= 1, the
    minimum effect a winner needs: the sweep's ``report.min_speedup`` otherwise); None once ``--help``
    is printed; UsageError (or ConfigError: a bad value) for anything else."""
    p = parser()
    ns = p.parse(args)
    if ns is None:
        return None
    out: dict[str, str | Path | float] = {k: v for k, v in vars(ns).items() if v is not None}
    empty = [p.options[dest] for dest, value in out.items() if value == ""]
    if empty:
        p.error(f"{empty[0]}: needs a value")
    if "out" in out:
        out["out"] = Path(str(out["out"])).resolve()
    if "min_speedup" in out:
        out["min_speedup"] = check_min_speedup(out["min_speedup"], "--min-speedup")
    return out


def main(args: list[str]) -> int:
    try:
        opts = parse(args)
        if opts is None:  # --help: printed
            return 0
        from ..experiment import plan

        plan.check_outputs()
        uri = store.check_existing_store(
            None,
            "no sweep to report on; run `python -m plnexp sweep` first (MLFLOW_TRACKING_URI or "
            "PLNEXP_OUTPUTS selects another)",
        )
        store.sweep_up_orphans(uri)
        report, folder, files = build(uri, **opts)
    except (UsageError, ConfigError, store.StoreError) as e:
        return fail(e)
    except OSError as e:
        print(f"plnexp: error: cannot write the report ({e.strerror or e}: {e.filename})", file=sys.stderr, flush=True)
        return 2
    show(report, folder, files)
    return 0
