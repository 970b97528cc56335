"""The two-sample tests of a window of live rows against a reference, per column,
vectorised in numpy with scipy's distributions for the p-values (docs/monitoring.md).

- Kolmogorov-Smirnov: the largest distance between the two empirical CDFs, exact with
  ties (integer features, lengths), its p-value from Kolmogorov's limiting distribution at
  the effective sample size m·n/(m+n), with Stephens' small-sample correction
  (`scipy.special.kolmogorov`, one vectorised call: within 5% of
  `scipy.stats.ks_2samp(method="asymp")`, whose exact `kstwo` loops in Python per column).
- Population stability index over bins cut at the reference's deciles.
- Chi-square of predicted-class counts against the reference's class frequencies.

Nothing here runs on the request path: the drift sampler's thread calls it once a window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PSI_BINS = 10
PSI_FLOOR = 1e-4  # an empty bin's share: PSI is infinite at 0


@dataclass(frozen=True, slots=True)
class ColumnsReference:
    """A numeric reference, (rows, columns), prepared once for every window's tests."""

    sorted: np.ndarray  # (m, c) float64, each column sorted
    cdf: np.ndarray  # (m, c): the reference's own empirical CDF at each sorted value
    psi_edges: np.ndarray  # (c, PSI_BINS - 1): the inner bin edges, at reference quantiles
    psi_share: np.ndarray  # (c, PSI_BINS): the reference's share of each bin

    @property
    def rows(self) -> int:
        return int(self.sorted.shape[0])

    @property
    def columns(self) -> int:
        return int(self.sorted.shape[1])


def columns_reference(rows: np.ndarray) -> ColumnsReference:
    ordered = np.sort(np.asarray(rows, dtype=np.float64), axis=0)
    quantiles = np.linspace(0, 1, PSI_BINS + 1)[1:-1]
    edges = np.quantile(ordered, quantiles, axis=0).T.copy()  # (c, bins - 1)
    m = ordered.shape[0]
    cdf = np.stack([np.searchsorted(col, col, side="right") for col in ordered.T], axis=1) / max(
        m, 1
    )
    return ColumnsReference(ordered, cdf, edges, _bin_shares(edges, ordered))


def _bin_shares(edges: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each column's share of rows per bin: bin k holds edges[k-1] < x <= edges[k]."""
    n, c = rows.shape
    index = (rows.T[:, :, None] > edges[:, None, :]).sum(axis=2)  # (c, n) bin of each value
    flat = index + np.arange(c)[:, None] * PSI_BINS
    counts = np.bincount(flat.ravel(), minlength=c * PSI_BINS).reshape(c, PSI_BINS)
    shares: np.ndarray = counts / max(n, 1)
    return shares


def ks_test(ref: ColumnsReference, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(statistic, p-value) per column of `window` (n, c) against the reference."""
    m = ref.rows
    win = np.sort(np.asarray(window, dtype=np.float64), axis=0)
    n, c = win.shape
    d = np.empty(c)
    # The largest CDF distance is reached at a value of either sample: evaluated at the
    # reference's values and at the window's, all sorted (searchsorted is fastest so).
    for j in range(c):  # each step is vectorised over the column's values
        r, w = ref.sorted[:, j], win[:, j]
        at_ref = np.abs(ref.cdf[:, j] - np.searchsorted(w, r, side="right") / n).max()
        at_win = np.abs(
            np.searchsorted(r, w, side="right") / m - np.searchsorted(w, w, side="right") / n
        ).max()
        d[j] = max(at_ref, at_win)
    from scipy import special  # the `monitoring` extra: checked when a monitor is made

    root = np.sqrt(m * n / (m + n))
    p: np.ndarray = special.kolmogorov((root + 0.12 + 0.11 / root) * d)  # Stephens' correction
    return d, p


def psi(ref: ColumnsReference, window: np.ndarray) -> np.ndarray:
    """Population stability index per column: sum of (live - ref) * ln(live / ref)."""
    live = np.maximum(_bin_shares(ref.psi_edges, np.asarray(window, np.float64)), PSI_FLOOR)
    expected = np.maximum(ref.psi_share, PSI_FLOOR)
    out: np.ndarray = ((live - expected) * np.log(live / expected)).sum(axis=1)
    return out


@dataclass(frozen=True, slots=True)
class ClassReference:
    """Predicted-class counts of the reference."""

    classes: np.ndarray  # sorted class ids
    counts: np.ndarray  # rows per class

    @property
    def rows(self) -> int:
        return int(self.counts.sum())


def class_reference(labels: np.ndarray) -> ClassReference:
    classes, counts = np.unique(np.asarray(labels, np.int64), return_counts=True)
    return ClassReference(classes, counts)


def chi_square(ref: ClassReference, labels: np.ndarray) -> tuple[float, float, float]:
    """(Cramér's V, p-value, chi2) of the two-sample test that the window's predicted
    classes and the reference's come from one distribution (the reference's own sampling
    noise counted, so a small reference does not raise false alarms). Classes the
    reference never saw share one column."""
    labels = np.asarray(labels, np.int64)
    k = len(ref.classes)
    slot = np.minimum(np.searchsorted(ref.classes, labels), k)
    known = slot < k
    known[known] = ref.classes[slot[known]] == labels[known]
    slot[~known] = k
    live = np.bincount(slot, minlength=k + 1)
    table = np.vstack((np.append(ref.counts, 0), live))
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or live.sum() == 0:
        return 0.0, 1.0, 0.0
    from scipy import stats

    result = stats.chi2_contingency(table, correction=False)
    chi2 = float(result.statistic)
    return float((chi2 / table.sum()) ** 0.5), float(result.pvalue), chi2
