"""The report's glossary: what its table's columns and verdicts mean, for the sweep it describes (a
sweep timed in interleaved rounds is explained by its rounds, one without them by its jobs' own
timed runs: never the rule of the other)."""

from __future__ import annotations

FLOOR = (
    "'× floor' (report.csv) is the run's ms/iter over the floor of the machine that ran it (logged by the run: "
    "the arrays its model must stream at its copy bandwidth plus its products and factorizations: 14 n×p "
    "arrays, two n×p×p products and Sigma's p×p Cholesky factor and inverse for full and profiled, 2 n×p and "
    "12 n×q arrays and six n×p×q products for pca of rank q, one n×p array fewer for offsets one per row; 1 "
    "would be a hand-fused kernel at the machine's limits)."
)


def glossary(report) -> list[str]:
    """The definitions, at the report's end (``report``: :class:`plnexp.report.entries.Report`)."""
    me = f"{report.min_speedup:.2f}×"
    common = [
        "One speed convention: 'time ÷ scan' (or ÷ the group's reference) is a strategy's time per iteration "
        "divided by the reference's; below 1 it is faster. '(a = b)' after a strategy names the strategies of "
        "its group whose compiled programs are identical (one hlo_fingerprint): one program, timed as one. "
        "'curve vs scan' is the largest relative difference of the run's ELBO curve to scan's. " + FLOOR,
        "",
    ]
    if report.verdicts:
        return common + [
            "The verdict rests on interleaved rounds: after the grid, each group's programs run again, every "
            "program once per round in a random order. 'time ÷ scan' is the median over the kept rounds of the "
            "run's time divided by the reference's in the same round (a paired ratio: a busy neighbour slows "
            "both sides of a pair alike); '95% interval' holds that median with 95% confidence (order "
            "statistics, no distribution assumed; 'unbounded': too few rounds); 'ms/iter (rounds)' is the "
            "median of the run's own ms/iter over those rounds (on a busy machine it may order otherwise than the "
            "ratio, which pairs each round with the reference's: the ratio ranks); 'rounds' the kept rounds its ratio rests on "
            "(fewer than the group's once its verdict stood: it sat out the rest). 'faster' or 'slower' when "
            f"the whole interval lies beyond the minimum effect {me} (report.min_speedup), 'tied' when it lies "
            "within it, 'unresolved' otherwise: the headline says why (the round budget "
            "report.rounds_budget_s spent, the cap report.rounds reached, rounds dropped as noise) and which "
            "value would decide it. A strategy is named fastest when its interval lies below every other "
            f"program's by {me} at least. A round whose host calibration moved during it is dropped and "
            "counted (docs/concepts/study.md). Each job's own timed run (report.csv's ms_per_iter, run_s, "
            "n_runs) is one measurement of that job, taken alone: it ranks nothing.",
            "",
        ]
    return common + [
        "Without rounds (report.rounds=0) the jobs' own timed runs are all there is: 'ms/iter (own runs)' is "
        "the median of a job's timed runs, 'runs' their number. A strategy is named fastest only when its "
        "interval (the interquartile range of its timed runs, their range below 5 runs) lies below the next "
        f"one's, its lead is at least the minimum effect {me} (report.min_speedup; `python -m plnexp report "
        "--min-speedup X` ranks again), and it exceeds the A/A noise between jobs: the largest relative "
        "difference of the median ms/iter of two jobs of one program, or of the control job (marked "
        "'(control)': the sweep's reference job run again at its end, never ranked) and its original, known "
        "from 2 such pairs or the control's. Without it, no winner is named.",
        "",
    ]
