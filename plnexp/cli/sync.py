"""The fits' results kept locally when the store failed (:mod:`plnexp.store.pending`): ``python -m
plnexp sync`` sends them, and every command sends them first (:func:`send_pending`); then the runs
whose owners are gone are marked FAILED (:func:`sweep_up`)."""

from __future__ import annotations

import sys

from .. import store
from ..experiment import plan
from ..jobs import config as C
from ..system.commandline import Parser, UsageError, fail, first_line
from ..system.redact import redact_text


def send_pending(uri: str) -> None:
    """Send the fits' results kept locally for this store (:mod:`plnexp.store.pending`): before
    anything reads the store or sweeps up orphans, so such a run is neither marked FAILED nor fitted
    again by ``resume=true``. A store that still fails leaves them kept, with one line."""
    if not store.store_exists(uri) or not store.pending.waiting(uri):
        return
    try:
        for line in store.pending.send_all(uri):
            print(line, file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - the store's failure: the results stay kept
        print(
            f"plnexp: warning: cannot send the results kept in {store.pending.folder()} yet ({first_line(e)}); "
            "`python -m plnexp sync` sends them",
            file=sys.stderr,
            flush=True,
        )


SYNC_USAGE = "python -m plnexp sync [tracking_uri=URI]"
SYNC_HELP = (
    "Send the fits' results kept under <outputs>/pending when the store failed after the fit, to the\n"
    "store (tracking_uri=, else MLFLOW_TRACKING_URI, else the one under the outputs folder): one line\n"
    "per run sent, exit 0; one line and exit 2 if the store cannot be reached, 1 if a write fails\n"
    "(the results stay kept)."
)


def sync(args: list[str]) -> int:
    """``plnexp sync``: send the results kept locally for the store (:mod:`plnexp.store.pending`),
    one line per run sent; exit 0 when all are sent; one line and exit 2 if the store cannot be
    reached, 1 if a write fails (the results stay kept)."""
    p = Parser(SYNC_USAGE, SYNC_HELP, unknown="unknown argument {arg}")
    p.add_argument("settings", nargs="*", metavar="tracking_uri=URI", help="the store to send them to")
    try:
        ns = p.parse(args)
        if ns is None:  # --help: printed
            return 0
        other = [a for a in ns.settings if not a.startswith("tracking_uri=")]
        if other:
            p.error(f"unknown argument {other[0]}")
    except UsageError as e:
        return fail(e)
    given = [a.split("=", 1)[1] for a in ns.settings if a.startswith("tracking_uri=")]
    explicit = given[-1] if given else None
    folder = store.pending.folder()
    uri = store.tracking_uri(explicit)
    try:
        plan.check_outputs()
        bad = store.pending.unreadable()
        for path, why in bad:  # never sent: named, not skipped unsaid
            print(f"plnexp: error: {path}: a kept result that cannot be read ({why}); not sent", file=sys.stderr)
        if not store.pending.waiting(uri):
            unread = f" ({len(bad)} unreadable)" if bad else ""
            print(f"plnexp: no result kept in {folder} for {redact_text(uri)}{unread}: nothing to send", flush=True)
            if store.store_exists(uri):  # the runs a sweep whose store failed left RUNNING still end
                sweep_up(store.check_store(explicit))
            return 1 if bad else 0
        uri = store.check_store(explicit)
        for line in store.pending.send_all(uri):
            print(line, flush=True)
        sweep_up(uri)  # then the runs their gone owners left RUNNING (a sweep's parent its store failed under)
        if bad:
            return 1
    except (C.ConfigError, store.StoreError) as e:
        return fail(e)
    except Exception as e:  # noqa: BLE001 - the store failed while sending: one line
        print(
            f"plnexp: store error: {redact_text(uri)}: cannot send the results kept in {folder} ({first_line(e)}); "
            "they stay kept: run python -m plnexp sync again once the store is back",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def sweep_up(uri: str) -> None:
    """Mark FAILED the runs whose owners are gone; one line per kind of owner (the states of the
    SLURM jobs read back from the reason each run was ended with: ``slurm job <id> <state>``)."""
    orphans = store.sweep_up_orphans(uri)
    jobs = [r for r in orphans if isinstance(r.owner, store.SlurmJob)]
    local = [r for r in orphans if not isinstance(r.owner, store.SlurmJob)]
    if local:
        pids = sorted({str(r.owner.pid) if isinstance(r.owner, store.LocalProcess) else "?" for r in local})
        print(
            f"plnexp: {len(local)} run(s) left RUNNING by process(es) {', '.join(pids)} on this host, which "
            f"no longer exist, marked FAILED (reason=orphaned)",
            file=sys.stderr,
            flush=True,
        )
    if jobs:
        state = {r.owner.job: r.reason.rsplit(" ", 1)[-1] for r in jobs if isinstance(r.owner, store.SlurmJob)}
        ids = sorted(state, key=lambda j: (tuple(int(p) if p.isdigit() else 0 for p in j.split("_")), j))
        print(
            f"plnexp: {len(jobs)} run(s) left RUNNING by slurm job(s) {', '.join(ids)}, which ended "
            f"({', '.join(state[j] for j in ids)}), marked FAILED (reason=slurm job <id> <state>)",
            file=sys.stderr,
            flush=True,
        )
