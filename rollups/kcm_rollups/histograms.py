"""Explicit-bucket histogram math: quantiles estimated as Prometheus does (Spark merges the bucket counts)."""

from __future__ import annotations

from collections.abc import Sequence

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def histogram_quantile(q: float, bounds: Sequence[float], bucket_counts: Sequence[int]) -> float | None:
    """The q-quantile of an OTLP explicit-bucket histogram, interpolated linearly inside its bucket like
    Prometheus' `histogram_quantile`; None when there is nothing to estimate from (or a bucket count is unknown).

    OTLP bucket i holds (bounds[i-1], bounds[i]]; the last bucket is (bounds[-1], +Inf).
    """
    if not bounds or len(bucket_counts) != len(bounds) + 1 or None in bucket_counts or not 0 <= q <= 1:
        return None
    total = sum(bucket_counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0
    for index, count in enumerate(bucket_counts):
        below = cumulative
        cumulative += count
        if cumulative >= rank and count > 0:
            break
    if index == len(bounds):
        # The +Inf bucket has no width to interpolate in: Prometheus answers its lower bound.
        return float(bounds[-1])
    upper = float(bounds[index])
    if index == 0:
        if upper <= 0:
            return upper
        lower = 0.0
    else:
        lower = float(bounds[index - 1])
    return lower + (upper - lower) * (rank - below) / count
