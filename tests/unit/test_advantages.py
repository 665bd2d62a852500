"""Group advantages: centring, population-std normalisation, degenerate groups."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlrun.rules.advantages import group_advantages


def test_centred_without_std():
    # mean of [1, 0, 0, 1] = 0.5 → [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=False) == [0.5, -0.5, -0.5, 0.5]


def test_centred_keeps_group_order():
    # mean of [3, 0, 0] = 1 → [2, -1, -1]
    adv = group_advantages([3.0, 0.0, 0.0], normalize_std=False)
    assert adv == pytest.approx([2.0, -1.0, -1.0])


def test_population_std_normalisation():
    # rewards [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25]
    # population variance = (0.5625 + 3 * 0.0625) / 4 = 0.75 / 4 = 0.1875
    # std = sqrt(0.1875) ≈ 0.4330127
    # (sample std would be sqrt(0.25) = 0.5, giving 1.5 for the first one)
    std = math.sqrt(0.1875)
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], normalize_std=True, eps=0.0)
    assert adv == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    assert adv[0] == pytest.approx(1.7320508)  # = sqrt(3)


def test_eps_is_added_to_std():
    # rewards [2, 0]: centred [1, -1], population std 1 → 1 / (1 + 0.5)
    adv = group_advantages([2.0, 0.0], normalize_std=True, eps=0.5)
    assert adv == pytest.approx([2 / 3, -2 / 3])


@pytest.mark.parametrize("normalize_std", [True, False])
def test_all_equal_rewards_give_zeros(normalize_std):
    # 0.1 is not exact in binary: a naive mean could leave ±1e-17 residues, and dividing by a
    # tiny std would blow them up; the group has no signal, so all zeros.
    assert group_advantages([0.1, 0.1, 0.1], normalize_std) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0], normalize_std) == [0.0]


def test_empty_group():
    assert group_advantages([], normalize_std=True) == []


@given(st.lists(st.floats(-10, 10), min_size=2, max_size=16), st.booleans())
def test_advantages_sum_to_zero_and_have_unit_std(rewards, normalize_std):
    adv = group_advantages(rewards, normalize_std, eps=0.0)
    assert len(adv) == len(rewards)
    assert sum(adv) == pytest.approx(0.0, abs=1e-6)
    spread = max(rewards) - min(rewards)
    if normalize_std and spread > 1e-3:
        var = sum(a * a for a in adv) / len(adv)
        assert var == pytest.approx(1.0, rel=1e-6)
