"""The shared numerics of ``sketchopt._numerics`` (the package-internal testing hook)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sketchopt import _numerics

# Every exponent that matters for the four float formats: the clipping edges (``span`` is 278
# for float32, 2099 for float64), the normal range's ends, and a sweep across.
_EXPONENTS = sorted(
    {
        *range(-2200, 2201, 37),
        *(
            s * e
            for s in (-1, 1)
            for e in (
                0,
                1,
                126,
                127,
                128,
                149,
                150,
                277,
                278,
                279,
                1022,
                1023,
                1074,
                2098,
                2099,
                2100,
            )
        ),
    }
)


def _exact(x, e, dtype):
    """``x * 2**e`` rounded once to ``dtype`` (float64 is exact for every input here)."""
    with np.errstate(over="ignore", under="ignore"):
        ref = np.ldexp(np.asarray(x, np.float64), e)
        return ref if dtype == np.float64 else np.asarray(ref.astype(dtype), np.float64)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_ldexp_is_exact_for_every_exponent(dtype):
    dtype = jnp.dtype(dtype)
    with jax.enable_x64(dtype == jnp.float64):
        _check_ldexp(dtype)


def _check_ldexp(dtype):
    info = jnp.finfo(dtype)
    tiny, big = float(info.tiny), float(info.max)
    x = jnp.array(
        [1.0, -3.5, 0.1, 0.0, -0.0, np.inf, -np.inf, np.nan, big, -big, tiny, 3 * tiny], dtype
    )
    scale = jax.jit(_numerics.ldexp)
    for e in _EXPONENTS:
        got = np.asarray(scale(x, jnp.int32(e)), np.float64)
        ref = _exact(x, e, dtype)
        # XLA:CPU flushes subnormal results to zero; every other result is exact, signed zeros
        # and infinities included, and never a NaN from 0 * inf.
        subnormal = (ref != 0) & (np.abs(ref) < tiny)
        same = (got == ref) | (np.isnan(got) & np.isnan(ref))
        assert np.all(np.where(subnormal, same | (got == 0), same)), (e, got, ref)
        assert np.array_equal(np.signbit(got), np.signbit(ref)), e


def test_ldexp_with_an_array_of_exponents_falls_back_to_jnp():
    x = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    e = jnp.array([1, -1, 200], jnp.int32)
    np.testing.assert_array_equal(_numerics.ldexp(x, e), jnp.ldexp(x, e))
