"""Shared test configuration: Hypothesis profiles.

``ci`` (the default) keeps property tests modest and reproducible so the suite stays fast on a
2-core CPU machine: no deadline (the first example of a shape pays for JIT compilation), a fixed
derandomized example sequence, and at most 30 examples per test unless a test asks for fewer.
``dev`` explores more and randomly; select it with ``HYPOTHESIS_PROFILE=dev``.
"""

import os

# JAX's CPU eigh/qr go through LAPACK; a multi-threaded BLAS pool spins on a busy 2-core machine
# (a 100x100 eigh took ~80x longer), and pytest-xdist already uses both cores. Set before any
# test module imports jax.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
