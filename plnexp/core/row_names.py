"""The names of a data set's rows (samples, cells): from a pandas index, an AnnData's ``obs_names``,
or the index column of a CSV file (pandas' default ``to_csv`` writes one); a fit's ``latent`` is
named by them (:class:`plnexp.fitting.result.FitResult`)."""

from __future__ import annotations

from pathlib import Path

INDEX_HINT = "an index column, as pandas' to_csv writes by default? read it with plnexp.load_csv(..., index_col=0), or write the file with index=False"


def of_index(table) -> tuple[str, ...] | None:
    """The row names of a pandas object's index, or None for pandas' default ``RangeIndex(0, n)``
    and for objects without one (NumPy arrays). pandas is never imported."""
    index = getattr(table, "index", None)
    if index is None or not hasattr(index, "tolist"):
        return None
    if type(index).__name__ == "RangeIndex" and index.start == 0 and index.step == 1:
        return None
    return tuple(str(v) for v in index.tolist())


def split_index(header: list[str], lines: list[str], index_col: int, path: Path, what: str, error: type[Exception]):
    """(header, lines, row names) with the column ``index_col`` taken out of each line (an ``error``
    line naming the file if the header has no such column)."""
    if not 0 <= index_col < len(header):
        raise error(f"{what} file {path}: index_col={index_col}; allowed are 0 to {len(header) - 1} (its columns)")
    names, rest = [], []
    for ln in lines:
        cells = ln.split(",")
        names.append(cells.pop(index_col).strip().strip('"') if index_col < len(cells) else "")
        rest.append(",".join(cells))
    return header[:index_col] + header[index_col + 1 :], rest, tuple(names)


def hint(header: list[str], column: int) -> str:
    """The hint a non-numeric value in a CSV's first column gets where the header's first cell is
    empty (pandas' index column): how to read the file; "" otherwise."""
    return f" ({INDEX_HINT})" if column == 0 and header and header[0] == "" else ""
