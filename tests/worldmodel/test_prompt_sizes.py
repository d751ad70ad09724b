"""Prompt sizes in the forward model: a gamma through (mean, p90)."""

import numpy as np
import pytest

from worldmodel.servingmodel import gamma_exceed, prompt_cv_from_p90


@pytest.mark.parametrize("shape", [0.6, 1.0, 2.5, 10.0])
def test_the_cv_of_a_gamma_is_recovered_from_its_mean_and_p90(shape):
    x = np.random.default_rng(1).gamma(shape, 1000.0 / shape, 400_000)
    cv = prompt_cv_from_p90(float(x.mean()), float(np.quantile(x, 0.9)))
    assert cv == pytest.approx(1.0 / np.sqrt(shape), rel=0.03)
    for q in (0.5, 0.9, 0.99):
        assert gamma_exceed(float(x.mean()), cv, float(np.quantile(x, q))) == pytest.approx(1.0 - q, abs=0.01)


def test_a_trace_like_prompt_mix_gets_its_tail_closer_than_the_lognormal():
    # chat on the protocol traces: mean 1,154, p90 2,706, p99 4,141 tokens (lognormal through mean and p90: the
    # CV hits its 1.5 cap and P(X > p99) reads 4.6%)
    cv = prompt_cv_from_p90(1154.0, 2706.0)
    assert 0.95 < cv < 1.15
    assert 0.01 < gamma_exceed(1154.0, cv, 4141.0) < 0.035
    assert prompt_cv_from_p90(1000.0, 900.0) == 0.0
