"""Data loading: the shipped oaks set, CSV validation (one clear error per kind), counts in memory
(plnexp.as_data: NumPy arrays and pandas DataFrames, checked by the CSV loader's own checks),
simulation."""

import re
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
        (
            "a,b\n1,x\n",
            "counts file .*counts.csv: non-numeric value 'x' at row 1, column 2; allowed values are numbers",
        ),
        ("a,b\n1,2\n\n3, y \n", "counts file .*counts.csv: non-numeric value 'y' at row 2, column 2;"),
        ("a,b\n1,2,3\n", "counts file .*counts.csv.*line 2 has 3 fields, header has 2"),
        ("", "counts file .*counts.csv.*empty"),
        ("a,b\n", "counts file .*counts.csv.*empty"),
    ],
)
def test_load_csv_bad_counts(tmp_path, content, message):
    path = _write(tmp_path / "counts.csv", content)
    with pytest.raises(DataError, match=message) as err:
        plnexp.load_csv(path)
    assert "\n" not in str(err.value)


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
            "text.csv",
            "a,b,c\n10,10,10\n1,1,1\n1,1,lots\n1,1,1\n",
            "offsets file .*text.csv: non-numeric value 'lots' at row 3, column 3; allowed values are numbers",
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
    from plnexp.core.data import DataWarning

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


def test_csv_header_names_the_count_columns(files):
    _, counts, _, _ = files
    assert plnexp.load_csv(counts).columns == ("a", "b", "c")
    assert plnexp.replicate(plnexp.load_csv(counts), 2).columns == ("a", "b", "c")
    oaks = plnexp.load_oaks()
    assert oaks.columns is not None and len(oaks.columns) == oaks.p


# ---------------------------------------------------------------- counts in memory: plnexp.as_data
def test_as_data_of_arrays_is_what_load_csv_reads(files):
    """The same counts, totals and covariates as arrays give the CSV loader's Data, value for value."""
    _, counts, offsets, covs = files
    from_files = plnexp.load_csv(counts, offsets=offsets, covariates=covs)
    Y = np.array([[1, 0, 3], [4, 5, 6], [0, 0, 1], [2, 2, 2]])  # integers: any numeric dtype
    totals = np.array([10.0, 20.0, 5.0, 8.0])  # one per row: the same for the row's 3 counts
    group = np.array(["u", "v", "u", "v"])
    x = np.array([0.5, 1.5, 2.0, 0.1])
    covariates = np.empty((4, 2), dtype=object)
    covariates[:, 0], covariates[:, 1] = group, x
    data = plnexp.as_data(Y, offsets=totals, covariates=covariates)
    for a, b in ((data.Y, from_files.Y), (data.O, from_files.O), (data.X, from_files.X)):
        np.testing.assert_array_equal(a, b)
    assert data.covariate_names == ("intercept", "x1=v", "x2")  # an array's columns: x1, x2, ...
    assert data.digest() == from_files.digest() and data.columns is None
    assert data.Y.dtype == np.float64 and data.name == "data"
    # (n, p) totals, and offsets already on the log scale
    np.testing.assert_array_equal(plnexp.as_data(Y, np.tile(totals[:, None], 3)).O, data.O)
    np.testing.assert_array_equal(plnexp.as_data(Y, np.log(totals), log_offsets=True).O, data.O)
    # defaults: no offsets, an intercept only
    plain = plnexp.as_data(Y)
    assert plain.O.shape == (4, 3) and not plain.O.any()
    np.testing.assert_array_equal(plain.X, np.ones((4, 1)))
    assert plain.covariate_names == ("intercept",)


def test_as_data_of_a_dataframe_keeps_its_column_names(files):
    pd = pytest.importorskip("pandas")
    _, counts, offsets, covs = files
    from_files = plnexp.load_csv(counts, offsets=offsets, covariates=covs)
    Y = pd.DataFrame({"a": [1, 4, 0, 2], "b": [0, 5, 0, 2], "c": [3, 6, 1, 2]})
    cov = pd.DataFrame({"group": ["u", "v", "u", "v"], "x": [0.5, 1.5, 2.0, 0.1]})
    depth = pd.Series([10.0, 20.0, 5.0, 8.0], name="depth")
    data = plnexp.as_data(Y, offsets=depth, covariates=cov, name="mine")
    assert data.columns == ("a", "b", "c") and data.name == "mine"
    assert data.covariate_names == from_files.covariate_names == ("intercept", "group=v", "x")
    assert data.digest() == from_files.digest()
    assert plnexp.as_data(Y, covariates=cov["x"]).covariate_names == ("intercept", "x")  # a Series


@pytest.mark.parametrize(
    "counts, kwargs, message",
    [
        ([[1, -2]], {}, "counts: negative count -2 at row 1, column 2; allowed values are non-negative integers"),
        ([[1, 2.5]], {}, "counts: non-integer count 2.5 at row 1, column 2; allowed values are non-negative integers"),
        ([[1, 2], [np.nan, 0]], {}, r"counts: missing \(NaN\) value at row 2, column 1; allowed values are non-neg"),
        ([[1, np.inf]], {}, "counts: infinite value at row 1, column 2"),
        ([1, 2, 3], {}, r"counts: must be a non-empty 2-d table \(n samples x p variables\), got shape \(3,\)"),
        (np.array([["1", "x"]], dtype=object), {}, "counts: non-numeric value 'x' at row 1, column 2; allowed values"),
        (
            [[1, 2], [3, 4]],
            {"offsets": np.ones(3)},
            r"offsets: shape \(3,\) does not match counts \(2, 2\); "
            r"allowed shapes are \(2, 2\), \(2,\) or \(2, 1\)",
        ),
        (
            [[1, 2], [3, 4]],
            {"offsets": np.array([1.0, 0.0])},
            "offsets: offset 0 at row 2, column 1; allowed values are "
            r"finite numbers > 0 \(raw totals; log_offsets=true",
        ),
        ([[1, 2], [3, 4]], {"covariates": np.ones((3, 1))}, "covariates: 3 rows, counts have 2"),
        (
            [[1, 2], [3, 4]],
            {"covariates": np.array([5.0, 5.0])},
            "covariates: column 'x1' is a linear combination of the intercept",
        ),
        ([[1, 2], [3, 4]], {"covariates": np.array([1.0, np.nan])}, r"covariates: missing \(NaN\) value at row 2"),
    ],
)
def test_as_data_bad_values_are_one_line_naming_the_argument(counts, kwargs, message):
    with pytest.raises(DataError, match=f"^{message}") as err:
        plnexp.as_data(np.asarray(counts) if isinstance(counts, list) else counts, **kwargs)
    assert "\n" not in str(err.value)


def test_counts_too_large_for_float32_are_one_line_naming_the_largest(tmp_path):
    """A count of 1e40 overflows float32 (a failed fit, its optimum cached): refused before the fit, in
    one line naming the argument (or file), the largest count, its place and the allowed range."""
    from plnexp.core.data_checks import COUNTS_MAX

    counts = np.array([[1.0, 2.0], [1e40, 3.0], [5.0, 1e30]])
    largest, allowed = (
        re.escape(f"{1e40:g}"),
        re.escape(f"allowed values are non-negative integers up to {COUNTS_MAX!r}"),
    )
    with pytest.raises(
        DataError, match=rf"^counts: too large count {largest} at row 2, column 1 \(the largest\); {allowed}"
    ) as err:
        plnexp.as_data(counts)
    assert "\n" not in str(err.value)
    path = _write(tmp_path / "counts.csv", "a,b\n1,2\n3,1e40\n")
    with pytest.raises(
        DataError, match=rf"^counts file .*counts.csv: too large count {largest} at row 2, column 2"
    ) as err:
        plnexp.load_csv(path)
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="too large count"):
        plnexp.as_data(np.array([[0.0, np.nextafter(COUNTS_MAX, np.inf)]]))
    # #62: a count just above the bound and the bound, each to the last digit (not both "1.84e+19")
    with pytest.raises(DataError, match=re.escape("too large count 1.8446744073709552e+19 at row 1, column 2")):
        plnexp.as_data(np.array([[0.0, 2.0**64]]))
    # ordinary large counts (deep sequencing), up to the bound itself, are accepted as they are
    big = np.array([[1e6, 0.0], [2.0, 123456789.0], [7.0, np.floor(COUNTS_MAX)]])
    np.testing.assert_array_equal(plnexp.as_data(big).Y, big)


@pytest.mark.parametrize(
    "counts, kwargs, message",
    [
        (
            [[1, 2]],
            {},
            "counts: got a list; allowed are a NumPy array (n samples x p variables), a pandas DataFrame "
            "or a plnexp.Data (np.asarray(...) converts other arrays)",
        ),
        ("counts.csv", {}, "counts: got a str; allowed are a NumPy array"),
        (np.ones((2, 2)), {"offsets": [1.0, 2.0]}, "offsets: got a list; allowed are a NumPy array ((n, p), or (n,)"),
        (np.ones((2, 2)), {"covariates": (1.0, 2.0)}, "covariates: got a tuple; allowed are a NumPy array"),
    ],
)
def test_as_data_other_types_are_one_type_error_line(counts, kwargs, message):
    with pytest.raises(TypeError) as err:
        plnexp.as_data(counts, **kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_as_data_of_a_data_is_that_data():
    data = plnexp.simulate(n=10, p=3, d=1)
    assert plnexp.as_data(data) is data
    with pytest.raises(TypeError, match=r"^offsets, covariates: a plnexp.Data carries its own; allowed with counts"):
        plnexp.as_data(data, offsets=np.ones(10))


def test_as_data_warns_about_empty_columns_by_name():
    pd = pytest.importorskip("pandas")
    from plnexp.core.data import DataWarning

    with pytest.warns(DataWarning, match=r"counts of the DataFrame: 1 of 2 column\(s\) .*\(column 'otu2'\)"):
        plnexp.as_data(pd.DataFrame({"otu1": [1, 2], "otu2": [0, 0]}))
