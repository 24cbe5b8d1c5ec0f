"""The benchmarks' statistics: the distribution-free interval of a median (tests/bench/table.py)."""

from __future__ import annotations

import pytest

from tests.bench.table import median_interval


@pytest.mark.parametrize("n, ranks", [(6, (1, 6)), (10, (2, 9)), (24, (7, 18)), (48, (17, 32))])
def test_the_interval_of_the_median_is_the_sign_tests_order_statistics(n, ranks):
    """The 1-based ranks of the 95% interval as the binomial tables give them."""
    values = [float(i) for i in range(1, n + 1)][::-1]  # unsorted on purpose
    assert median_interval(values) == (float(ranks[0]), float(ranks[1]))


def test_too_few_values_have_no_interval():
    with pytest.raises(ValueError, match="5 values are too few"):
        median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
