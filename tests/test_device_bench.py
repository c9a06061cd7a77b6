"""``experiments/device_bench.py``'s arithmetic on the aot part's rows (no compile)."""

from __future__ import annotations

import pytest

from experiments import device_bench
from sketchopt import shampoo


def test_a_period_amortizes_the_update_and_the_step_in_its_switch():
    """``kron_fd``'s bytes over a refresh period take the refresh step as the whole update
    counts it (XLA's costliest branch) and the step between refreshes as compiled in a switch,
    not the branches compiled alone (XLA fuses those across the switch's boundary)."""
    rows = {
        "optax.adam": {"bytes_accessed": 10.0},
        "kron_fd": {"bytes_accessed": 40.0, "peer": "optax.adam"},
        "kron_fd refresh step": {"bytes_accessed": 41.0},
        "kron_fd between refreshes": {"bytes_accessed": 19.0},
        "kron_fd between refreshes, in the switch": {"bytes_accessed": 21.0},
    }
    device_bench._amortize(rows)
    period = shampoo.PERIOD
    expected = (40.0 + (period - 1) * 21.0) / period
    assert rows["kron_fd"]["amortized_bytes_accessed"] == pytest.approx(expected)
    assert rows["kron_fd"]["amortized_bytes_over_peer"] == pytest.approx(expected / 10.0)
    del rows["kron_fd"]["amortized_bytes_accessed"]
    del rows["kron_fd between refreshes, in the switch"]
    device_bench._amortize(rows)  # without the in-switch step: nothing to amortize
    assert "amortized_bytes_accessed" not in rows["kron_fd"]
