"""Rank selection for PLN-PCA in a sweep's report (#34): the rank BIC picks and the rank ICL picks,
as PLNmodels' ``PLNPCA(ranks = 1:5)`` and its ``getBestModel("BIC")`` / ``getBestModel("ICL")`` do.

A report (:mod:`plnexp.report.summary`) asks :func:`lines` (the headline), :func:`markdown` (a table per
data set) and :func:`figures` (``pca_rank.png``). They say something only where the report is
about ranks (:func:`active`): ``sweep=pca_rank``, or any sweep whose finished PCA runs have more
than one rank. Everything is read from the runs' metrics, logged by :mod:`plnexp.experiment.runner` through
:mod:`plnexp.measure.criteria` (PLNmodels' conventions, larger is better): ``loglik`` (the float64 ELBO at
the final parameters), ``n_params``, ``bic``, ``icl``; nothing is computed here but the picks.

- The runs compared: plnexp's finished ``model=pca`` runs that logged ``bic`` (runs of the other
  models, runs logged before the criteria, the control job and peers are left out), by data set and
  the other values the sweep varies (optimizer, precision...): one selection each. Where two runs
  have one rank (a sweep resumed, a key that tells them apart only in its name), the one with the
  higher ``loglik`` stands for it: the better fit of the same model.
- A pick is the rank whose criterion is largest (ties: the smaller rank). One at the largest rank
  tried is said to be at the edge of the grid: a larger rank may do better still (likewise a pick at
  the smallest rank tried above 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..measure import plots
from .entries import SHORT, DASH, by, md_table, num, varying, Entry, Report


PRESET = "pca_rank"  # the sweep file whose report this is (conf/sweep/pca_rank.yaml)
PCA = "pca"
RANK_KEY = "model.rank"  # the run's param holding its rank
CRITERIA = (("bic", "BIC"), ("icl", "ICL"))  # metric -> its name in the report
FIGURE = "pca_rank.png"


@dataclass(frozen=True)
class Row:
    """One rank of a selection: its run and what the run logged."""

    rank: int
    name: str  # the run's name
    loglik: float
    n_params: float
    bic: float
    icl: float

    def value(self, key: str) -> float:
        return float(getattr(self, key))


@dataclass(frozen=True)
class Selection:
    """The ranks of one data set (and one value of each other key the sweep varies), and the picks."""

    label: str  # the data set and the other values, as the report names them
    rows: tuple[Row, ...]  # one per rank, by rank
    missing: tuple[int, ...] = ()  # ranks whose runs did not finish or logged no criteria

    @property
    def ranks(self) -> list[int]:
        return [r.rank for r in self.rows]

    def pick(self, key: str) -> Row:
        """The row with the largest ``key`` (``bic``, ``icl``); the smaller rank on a tie."""
        finite = [r for r in self.rows if math.isfinite(r.value(key))] or list(self.rows)
        return max(finite, key=lambda r: (r.value(key), -r.rank))

    def runner_up(self, key: str) -> Row | None:
        """The second best row by ``key`` (None with one rank)."""
        best = self.pick(key)
        rest = [r for r in self.rows if r is not best and math.isfinite(r.value(key))]
        return max(rest, key=lambda r: (r.value(key), -r.rank), default=None)

    def edge(self, rank: int) -> str:
        """Why a pick at ``rank`` may not be the best rank: it is the largest rank tried (or the smallest,
        above 1); "" otherwise."""
        if len(self.rows) < 2:
            return ""
        if rank == max(self.ranks):
            return f"{rank} is the largest rank tried: a larger rank may be better (add ranks above {rank})"
        if rank == min(self.ranks) and rank > 1:
            return f"{rank} is the smallest rank tried: a smaller rank may be better (add ranks below {rank})"
        return ""

    def lead(self, key: str) -> str:
        """``ahead of rank 4 by 59.0``: how far the pick of ``key`` leads the next best rank."""
        best, nxt = self.pick(key), self.runner_up(key)
        return f"ahead of rank {nxt.rank} by {best.value(key) - nxt.value(key):,.1f}" if nxt is not None else ""

    def line(self) -> str:
        """The headline: the rank each criterion picks on this data set, how far ahead, and whether it
        is at the edge of the grid."""
        head = f"PLN-PCA rank on {self.label}"
        if len(self.rows) < 2:
            only = f"only rank {self.rows[0].rank} finished" if self.rows else "no run logged BIC and ICL"
            return f"{head}: no choice, {only}" + self._missing()
        (k1, n1), (k2, n2) = CRITERIA
        q1, q2 = self.pick(k1).rank, self.pick(k2).rank
        if q1 == q2:
            picks = f"{n1} and {n2} both pick rank {q1} ({n1} {self.lead(k1)}, {n2} {self.lead(k2)})"
            edges = [self.edge(q1)]
        else:
            picks = f"{n1} picks rank {q1} ({self.lead(k1)}); {n2} picks rank {q2} ({self.lead(k2)})"
            edges = [self.edge(q) for q in sorted({q1, q2})]
        edge = "".join(f"; rank {e}" for e in edges if e)
        return f"{head}: {picks}{edge}; ranks {_ranks(self.ranks)} tried" + self._missing()

    def _missing(self) -> str:
        if not self.missing:
            return ""
        return (
            f"; rank{'s' if len(self.missing) > 1 else ''} {_ranks(list(self.missing))} did not finish or logged no BIC"
        )


def _ranks(ranks: list[int]) -> str:
    """``1–5`` for consecutive ranks, else ``1, 2, 4``."""
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks))


# ---------------------------------------------------------------- the runs
def rank(e: Entry) -> int | None:
    """The run's PLN-PCA rank (its ``model.rank`` param), None for a run of another model."""
    if e.params.get("model.name") != PCA:
        return None
    try:
        return int(str(e.params.get(RANK_KEY)))
    except ValueError:
        return None


def _pca_runs(report: Report) -> list[Entry]:
    """plnexp's PCA runs of the sweep's grid (the control job and the peers left out), any status."""
    return [e for e in report.grid if rank(e) is not None]


def _scored(e: Entry) -> bool:
    return e.status == "FINISHED" and math.isfinite(e.m("bic"))


def active(report: Report) -> bool:
    """Whether the report is about ranks: ``sweep=pca_rank``, or PCA runs with criteria of 2+ ranks."""
    return report.ran(PRESET) or len({rank(e) for e in _pca_runs(report) if _scored(e)}) > 1


def _key(report: Report, e: Entry) -> tuple:
    """The run's comparison group without its rank: its data set and the other values varied."""
    keep = [v for k, v in zip(report.extra_keys, e.extra) if k != RANK_KEY]
    return (e.data, e.device, e.precision, *keep)


def selections(report: Report) -> list[Selection]:
    """One :class:`Selection` per data set and value of the other keys the sweep varies, in run order."""
    runs = _pca_runs(report)
    groups = by(runs, lambda e: _key(report, e))
    differ = varying(list(groups), 1)  # the group keys (past the data set) whose values differ
    out = []
    for key, members in groups.items():
        best: dict[int, Entry] = {}
        for e in members:
            q = rank(e)
            assert q is not None  # _pca_runs: every run has one
            if _scored(e) and (q not in best or e.m("loglik") > best[q].m("loglik")):
                best[q] = e
        rows = tuple(
            Row(q, e.name, e.m("loglik"), e.m("n_params"), e.m("bic"), e.m("icl")) for q, e in sorted(best.items())
        )
        missing = tuple(sorted({q for e in members if (q := rank(e)) is not None and q not in best}))
        out.append(Selection(_label(report, members[0], key, differ), rows, missing))
    return out


def _label(report: Report, e: Entry, key: tuple, varying: list[int]) -> str:
    names = ["device", "precision", *(k for k in report.extra_keys if k != RANK_KEY)]
    extra = [f"{SHORT.get(names[i - 1], names[i - 1])}={key[i]}" for i in varying]
    return ", ".join([f"{e.data} ({e.shape})", *extra])


# ---------------------------------------------------------------- the report's hooks
def lines(report: Report) -> list[str]:
    """The headline: per data set, the rank BIC picks and the rank ICL picks; [] where not :func:`active`."""
    if not active(report):
        return []
    found = selections(report)
    if not found:
        return ["PLN-PCA rank: no model=pca run of the sweep logged BIC and ICL (runs from before them?)"]
    return [s.line() for s in found]


def table(s: Selection) -> list[str]:
    """rank | loglik | n_params | BIC | ICL | picked by, the picks in bold."""
    picks = {key: s.pick(key).rank for key, _ in CRITERIA}
    rows = []
    for r in s.rows:
        cells = [str(r.rank), num(r.loglik, "{:,.2f}", DASH), num(r.n_params, "{:,.0f}", DASH)]
        for key, _ in CRITERIA:
            text = num(r.value(key), "{:,.2f}", DASH)
            cells.append(f"**{text}**" if picks[key] == r.rank else text)
        cells.append(", ".join(name for key, name in CRITERIA if picks[key] == r.rank) or "")
        rows.append(cells)
    return md_table(["rank", "loglik", "n_params", "BIC", "ICL", "picked by"], rows, "|---:|---:|---:|---:|---:|---|")


def markdown(report: Report) -> list[str]:
    """The report's rank section (Markdown lines): the conventions, then a table per selection."""
    if not active(report):
        return []
    out = [
        "## Rank selection (PLN-PCA)",
        "",
        "One PLN-PCA fit per rank q. Per run: loglik, the float64 ELBO at its final parameters (a lower "
        "bound of the log-likelihood, with -log y!); n_params = p (d + q) - q (q - 1)/2, its free parameters "
        "(B and the loadings C up to a rotation); BIC = loglik - n_params/2 log n; ICL = BIC - the entropy of "
        "the variational posterior of the latent positions, 1/2 (n q log(2πe) + Σ log S²), which penalises "
        "positions the data leave uncertain. PLNmodels' conventions (R PLNmodels' PLNPCAfit; larger is "
        "better, as its getBestModel picks): the pick of each criterion in bold. A pick at the largest rank "
        "tried says that a larger rank may be better: add ranks. A rank whose ELBO curve has not flattened is "
        "under-fitted and penalised unfairly (see elbo_curves.png).",
        "",
    ]
    found = selections(report)
    if not found:
        return [*out, "No model=pca run of the sweep logged BIC and ICL.", ""]
    for s in found:
        out += [f"{s.label}: {s.line().split(': ', 1)[1]}", ""]
        if s.rows:
            out += [*table(s), ""]
    return out


def figures(report: Report, folder: Path) -> list[str]:
    """``pca_rank.png`` in ``folder`` where the report is :func:`active` and a selection has 2+ ranks;
    its name, or []."""
    if not active(report):
        return []
    found = [s for s in selections(report) if len(s.rows) > 1]
    if not found:
        return []
    draw(found, Path(folder) / FIGURE)
    return [FIGURE]


STYLE = {  # metric -> (label, colour, marker)
    "loglik": ("ELBO (loglik)", "0.45", "o"),
    "bic": ("BIC", "C0", "s"),
    "icl": ("ICL", "C3", "D"),
}


def draw(found: list[Selection], path: Path) -> Path:
    """Per selection, two panels against the rank: the ELBO, BIC and ICL as they are (the ELBO keeps
    rising with the rank; the penalised criteria turn down past the pick), and BIC and ICL below their
    best (symmetric-log axis: gaps of tens and of thousands of nats both readable); each pick ringed."""
    fig, axes = plots.panels_figure(2 * len(found), 10, 3.6, extra=0)
    for left, right, s in zip(axes[::2], axes[1::2], found):
        ranks = np.array(s.ranks)
        for key, (label, color, marker) in STYLE.items():
            y = np.array([r.value(key) for r in s.rows])
            left.plot(ranks, y, marker=marker, ms=5, lw=1.4, color=color, label=label)
            if key == "loglik":
                continue
            best = s.pick(key)
            left.plot([best.rank], [best.value(key)], marker="o", ms=13, mfc="none", mec=color, mew=1.6)
            gap = best.value(key) - y
            right.plot(ranks, gap, marker=marker, ms=5, lw=1.4, color=color, label=f"{label}: picks {best.rank}")
            right.plot([best.rank], [0.0], marker="o", ms=13, mfc="none", mec=color, mew=1.6)
        left.set_title(f"{s.label}: ELBO, BIC, ICL (larger is better)", fontsize=9)
        left.set_ylabel("nats")
        edge = any(s.pick(key).rank == max(s.ranks) for key, _ in CRITERIA)
        note = "\na pick at the largest rank tried: a larger rank may be better" if edge else ""
        right.set_title(f"below each criterion's best (0: its pick, ringed){note}", fontsize=9)
        right.set_yscale("symlog", linthresh=10.0)
        right.invert_yaxis()  # the best at the top, as on the left
        right.set_ylabel("best − value (nats, symlog)")
        for ax in (left, right):
            ax.set_xlabel("rank q")
            ax.set_xticks(ranks)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return plots.save(fig, path)
