"""Cost model: hand-computed examples, negative prices, owned vs rented, total > 0."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.cost import (
    DEFAULT_COST,
    NonPositiveCostError,
    energy_cost_usd,
    gpu_cost_owned_usd,
    gpu_cost_rented_usd,
    total_cost,
)
from schemas.provenance import Provenance


def test_defaults_tagged():
    assert DEFAULT_COST.rented_usd_per_gpu_h["H100"].value == 2.50
    assert DEFAULT_COST.rented_usd_per_gpu_h["A100"].value == 1.50
    assert DEFAULT_COST.pue.value == 1.3
    assert DEFAULT_COST.pue.provenance == Provenance.MODELED
    assert DEFAULT_COST.owned_usd_per_gpu_h("H100") == pytest.approx(30000 / (4 * 8760))  # 0.856 $/GPU-h
    assert DEFAULT_COST.owned_usd_per_gpu_h("A100") == pytest.approx(15000 / (4 * 8760))
    assert "pue" in DEFAULT_COST.as_dict()


def test_energy_cost_by_hand():
    # 500 kW for 0.5 h at $100/MWh, then 800 kW for 0.25 h at $40/MWh, PUE 1.3
    kw, h, price = np.array([500.0, 800.0]), np.array([0.5, 0.25]), np.array([100.0, 40.0])
    assert energy_cost_usd(kw, h, price) == pytest.approx(1.3 * (250 * 0.1 + 200 * 0.04))


def test_negative_price_credits_energy():
    assert energy_cost_usd(1000.0, 1.0, -20.0) == pytest.approx(-26.0)
    mixed = energy_cost_usd(np.array([1000.0, 1000.0]), 1.0, np.array([-20.0, 30.0]))
    assert mixed == pytest.approx(1.3 * 10)


def test_rented_vs_owned():
    # 2 H100 nodes (16 GPUs) for 3 h; only 6 GPU-hours warm
    rented = gpu_cost_rented_usd({"H100": 6.0})
    owned = gpu_cost_owned_usd({"H100": 16}, 3.0)
    assert rented == pytest.approx(15.0)
    assert owned == pytest.approx(16 * 3 * 30000 / 35040)
    # owned charges idle GPUs too, rented does not: same fleet fully warm costs the rate ratio
    assert gpu_cost_rented_usd({"H100": 48.0}) / owned == pytest.approx(2.5 / (30000 / 35040))


def test_total_cost_and_energy_share():
    c = total_cost(gpu_usd=100.0, energy_usd=-20.0, switch_usd=7.0)
    assert c.total_usd == pytest.approx(80.0)  # switch cost already inside gpu and energy, not added
    assert c.energy_share == pytest.approx(-0.25)
    assert c.switch_usd == 7.0


def test_total_cost_must_be_positive():
    with pytest.raises(NonPositiveCostError, match="must be > 0"):
        total_cost(gpu_usd=10.0, energy_usd=-10.0)
