"""Data loading: the shipped oaks set, CSV validation (one clear error per kind), simulation."""

from importlib import resources

import numpy as np
import pytest

import plnexp
from plnexp import DataError


def test_oaks_shapes_offsets_and_licence():
    data = plnexp.load_oaks()
    assert (data.n, data.p, data.d) == (116, 114, 1)
    raw = np.loadtxt(resources.files("plnexp.datasets") / "oaks" / "offsets.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(data.O, np.log(raw))  # offsets shipped raw, logged once
    licence = (resources.files("plnexp.datasets") / "oaks" / "LICENSE").read_text()
    assert "Permission is hereby granted" in licence and "Bastien Batardiere" in licence


def test_oaks_replication_and_covariates():
    big = plnexp.load_oaks(replication=100)
    assert (big.n, big.p) == (11600, 114)
    small = plnexp.load_oaks()
    np.testing.assert_array_equal(big.Y[116 * 7 : 116 * 8], small.Y)
    cov = plnexp.load_oaks(covariates=["tree", "orientation", "distTOground"])
    # tree has 3 levels -> 2 dummies, orientation 2 levels -> 1, distance numeric -> 1, + intercept
    assert cov.X.shape == (116, 5)
    assert np.linalg.matrix_rank(cov.X) == 5
    with pytest.raises(DataError, match="replication=0"):
        plnexp.load_oaks(replication=0)
    with pytest.raises(DataError, match="covariate 'height'.*allowed"):
        plnexp.load_oaks(covariates=["height"])


def test_simulate_is_seeded_and_keeps_truth():
    a = plnexp.simulate(n=200, p=6, d=2, seed=3)
    b = plnexp.simulate(n=200, p=6, d=2, seed=3)
    c = plnexp.simulate(n=200, p=6, d=2, seed=4)
    np.testing.assert_array_equal(a.Y, b.Y)
    assert not np.array_equal(a.Y, c.Y)
    assert a.truth["B"].shape == (2, 6) and a.truth["Sigma"].shape == (6, 6)
    assert np.all(np.linalg.eigvalsh(a.truth["Sigma"]) > 0)
    assert a.digest() == b.digest() != c.digest()


def _write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def files(tmp_path):
    counts = _write(tmp_path / "counts.csv", "a,b,c\n1,0,3\n4,5,6\n0,0,1\n2,2,2\n")
    offsets = _write(tmp_path / "offsets.csv", "a,b,c\n10,10,10\n20,20,20\n5,5,5\n8,8,8\n")
    covs = _write(tmp_path / "cov.csv", "group,x\nu,0.5\nv,1.5\nu,2.0\nv,0.1\n")
    return tmp_path, counts, offsets, covs


def test_load_csv_good(files):
    _, counts, offsets, covs = files
    data = plnexp.load_csv(counts, offsets=offsets, covariates=covs)
    np.testing.assert_array_equal(data.Y[:2], [[1, 0, 3], [4, 5, 6]])
    np.testing.assert_allclose(data.O[:2], np.log([[10] * 3, [20] * 3]))
    assert data.covariate_names == ("intercept", "group=v", "x")
    logged = plnexp.load_csv(counts, offsets=offsets, log_offsets=True)
    np.testing.assert_allclose(logged.O[:2], [[10] * 3, [20] * 3])


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "a,b\n1,-2\n",
            "counts file .*counts.csv.*negative count -2 at row 1, column 2; allowed values are non-negative integers",
        ),
        ("a,b\n1,2.5\n", "counts file .*counts.csv.*non-integer count 2.5 at row 1, column 2"),
        ("a,b\n1,NA\n", r"counts file .*counts.csv.*missing \(NaN\) value at row 1, column 2; allowed values"),
        (
            "a,b\n1,inf\n",
            "counts file .*counts.csv.*infinite value at row 1, column 2; allowed values are non-negative",
        ),
        ("a,b\n1,-inf\n", "counts file .*counts.csv.*infinite value at row 1, column 2"),
        ("a,b\n1,x\n", "counts file .*counts.csv.*line 2 has a non-numeric value"),
        ("a,b\n1,2,3\n", "counts file .*counts.csv.*line 2 has 3 fields, header has 2"),
        ("", "counts file .*counts.csv.*empty"),
        ("a,b\n", "counts file .*counts.csv.*empty"),
    ],
)
def test_load_csv_bad_counts(tmp_path, content, message):
    path = _write(tmp_path / "counts.csv", content)
    with pytest.raises(DataError, match=message):
        plnexp.load_csv(path)


def test_load_csv_missing_file(tmp_path):
    with pytest.raises(DataError, match="counts file .*nope.csv: not found"):
        plnexp.load_csv(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    "kind, name, content, message",
    [
        (
            "offsets",
            "short.csv",
            "a,b,c\n10,10,10\n",
            r"offsets file .*short.csv: shape \(1, 3\) does not match counts \(4, 3\)",
        ),
        (
            "offsets",
            "zero.csv",
            "a,b,c\n10,0,10\n1,1,1\n1,1,1\n1,1,1\n",
            "offsets file .*zero.csv: offset 0 at row 1, column 2; allowed values are finite numbers > 0",
        ),
        (
            "offsets",
            "neg.csv",
            "a,b,c\n10,1,10\n1,1,-3\n1,1,1\n1,1,1\n",
            "offsets file .*neg.csv: offset -3 at row 2, column 3; allowed values are finite numbers > 0 .*log_offsets",
        ),
        (
            "offsets",
            "inf.csv",
            "a,b,c\n10,1,10\n1,1,1\n1,inf,1\n1,1,1\n",
            "offsets file .*inf.csv: infinite value at row 3, column 2; allowed values are finite numbers > 0",
        ),
        (
            "offsets",
            "nan.csv",
            "a,b,c\n10,NaN,10\n1,1,1\n1,1,1\n1,1,1\n",
            r"offsets file .*nan.csv: missing \(NaN\) value at row 1, column 2",
        ),
        ("covariates", "rows.csv", "x\n1\n2\n3\n", "covariates file .*rows.csv: 3 rows, counts have 4"),
        ("covariates", "gone.csv", None, "covariates file .*gone.csv: not found"),
        ("covariates", "empty.csv", "", "covariates file .*empty.csv: empty"),
        (
            "covariates",
            "const.csv",
            "x\n1\n1\n1\n1\n",
            "covariates file .*const.csv: column 'x' is a linear combination of the intercept .*rank-deficient; allowed "
            "values are linearly independent columns",
        ),
        (
            "covariates",
            "copy.csv",
            "x,y,z\n1,1,2\n2,1,3\n3,1,4\n5,2,7\n",
            "covariates file .*copy.csv: column 'z' is a linear combination of the intercept and the columns before it",
        ),
    ],
)
def test_load_csv_bad_offsets_and_covariates(files, kind, name, content, message):
    tmp, counts, _, _ = files
    path = tmp / name if content is None else _write(tmp / name, content)
    with pytest.raises(DataError, match=message):
        plnexp.load_csv(counts, **{kind: path})


@pytest.mark.parametrize(
    "value, message",
    [("inf", "infinite value at row 1, column 2"), ("nan", r"missing \(NaN\) value at row 1, column 2")],
)
def test_log_scale_offsets_must_be_finite(files, value, message):
    tmp, counts, _, _ = files
    path = _write(tmp / "log.csv", f"a,b,c\n0,{value},0\n0,0,0\n-1,-2,0\n0,0,0\n")
    with pytest.raises(DataError, match=f"offsets file .*log.csv: {message}; allowed values are finite numbers"):
        plnexp.load_csv(counts, offsets=path, log_offsets=True)
    ok = _write(tmp / "ok.csv", "a,b,c\n0,-5,0\n0,0,0\n-1,-2,0\n0,0,0\n")  # <= 0 is fine on the log scale
    assert plnexp.load_csv(counts, offsets=ok, log_offsets=True).O[0, 1] == -5


def test_empty_count_columns_are_named_in_one_warning_line(tmp_path, recwarn):
    from plnexp.data import DataWarning

    counts = tmp_path / "counts.csv"
    counts.write_text("otu1,otu2,otu3,otu4\n1,0,2,0\n3,0,0,0\n0,0,5,0\n")
    with pytest.warns(DataWarning) as caught:
        data = plnexp.load_csv(counts)
    (w,) = caught
    text = str(w.message)
    assert "\n" not in text and "2 of 4 column(s) have no counts at all (columns 'otu2', 'otu4')" in text
    assert str(counts) in text and data.Y.shape == (3, 4)  # loaded: a warning, not an error
    recwarn.clear()
    plnexp.load_oaks()  # oaks has no empty column: silent
    assert not [w for w in recwarn if issubclass(w.category, DataWarning)]
