"""What keeping a fit costs (issue #63): every run that fits logs its model (plnexp's fit format,
``plnexp.fitting.saved``: a JSON description and the float64 parameters in an .npz) as its
``model/`` artifact. For oaks replicated, model=full, float64 (a 5-iteration untimed fit: the
parameters' size does not depend on the iterations): the folder's size, and the median seconds of
``res.save`` (files written whole, fsynced, renamed into place) and ``plnexp.load_fit`` over
``--repeats``::

    .venv/bin/python benchmarks/saved_fit.py --replications 1,100,400
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import plnexp
from _header import machine_header


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", default="1,100,400")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    plnexp.runtime.configure()  # before machine_header starts JAX
    print("\n".join(machine_header("saved fit: size, save and load", argv)))
    print("replication,n,p,size_mb,save_ms,load_ms")
    with tempfile.TemporaryDirectory() as tmp:
        for rep in (int(r) for r in args.replications.split(",")):
            data = plnexp.load_oaks(replication=rep)
            res = plnexp.fit(data, model="full", precision="float64", n_iter=5, timed=False)
            saves, loads = [], []
            for k in range(args.repeats):
                folder = Path(tmp) / f"fit_{rep}_{k}"
                t0 = time.perf_counter()
                res.save(folder)
                saves.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                plnexp.load_fit(folder)
                loads.append(time.perf_counter() - t0)
            size = sum(f.stat().st_size for f in folder.iterdir())
            for k in range(args.repeats):
                shutil.rmtree(Path(tmp) / f"fit_{rep}_{k}")
            save_ms, load_ms = 1e3 * statistics.median(saves), 1e3 * statistics.median(loads)
            print(f"{rep},{data.n},{data.p},{size / 1e6:.2f},{save_ms:.0f},{load_ms:.0f}")


if __name__ == "__main__":
    main()
