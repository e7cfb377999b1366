"""benchmarks/core_contention.py: the three measurements and the ratios derived from them."""

from __future__ import annotations

import pytest

from benchmarks.core_contention import measure


@pytest.mark.slow
def test_the_ratios_come_from_the_three_measurements():
    result = measure(seconds=0.2)
    alone, two = result["one_thread_gflops"], result["two_threads_gflops"]
    pair = result["concurrent_gflops_each"]
    assert len(pair) == 2 and min(pair) > 0 and alone > 0 and two > 0
    assert result["two_threads_speedup"] == pytest.approx(two / alone)
    assert result["concurrent_share"] == pytest.approx(min(pair) / alone)
    assert result["overlap_ceiling"] == pytest.approx(sum(pair) / two)
