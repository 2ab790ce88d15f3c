"""The names of the tags a job's run carries in the store that more than one layer reads: one place
for each (the store writes them, the ranking and the reports read them back)."""

JOB_TAG = "plnexp.job"  # a sweep child's job number (its order in the sweep)
CONTROL_TAG = "plnexp.control"  # a sweep's control job ("true"): scan's job again, the noise between jobs
CONTROL_OF_TAG = "plnexp.control_of"  # the job number the control job repeats
MIN_SPEEDUP_TAG = "plnexp.min_speedup"  # the minimum effect the sweep ranks with (report.min_speedup)
PEER_TAG = "plnexp.peer"  # a peer's run: the peer's name (its row of the report, never ranked as a strategy)
PEER_OF_TAG = "plnexp.peer_of"  # the job of the grid whose data a peer's run fits
VERDICT_TAG = (
    "plnexp.verdict"  # a run's verdict against its group's reference: faster, tied, slower, unresolved, reference
)
REFERENCE_TAG = "plnexp.reference"  # the strategy its paired ratio divides by (the group's reference)
GROUP_TAG = "plnexp.group"  # the timed group it ran its rounds in (its label), one sweep's
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: a child run's parent (a sweep's job: the sweep's parent run)
STATUS_REASON_TAG = "status_reason"  # why a run ended as it did, in words
REASON_TAG = "reason"  # why a run ended, as a code: interrupted, orphaned, slurm job <id> <state>
OVERRIDES_TAG = "overrides"  # the command line's overrides that named the job, space-separated
DATASET_TAG = "dataset"  # the data set's label (oaks_x100)
DATA_N_TAG, DATA_P_TAG = "data_n", "data_p"  # the shape of the data a run fitted
SWEEP_TAG = "sweep"  # a sweep's parent run: the sweep's name (its sweep file)
JOBS_TAG = "jobs"  # a sweep's parent run: the number of jobs of its grid
COMMAND_TAG = "command"  # a sweep's parent run: the command that made it, after ``python -m plnexp``
