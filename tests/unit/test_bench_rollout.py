"""bench/rollout_throughput.py's pure rules: the rotated phase order and the verdict on a ratio."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import rollout_throughput as rollout  # noqa: E402 - bench/ is not a package


def test_every_phase_takes_every_position_over_three_rounds():
    orders = [rollout.phase_order(r) for r in (1, 2, 3, 4)]
    assert orders[:3] == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"]]
    assert orders[3] == orders[0]
    for position in range(3):
        assert sorted(order[position] for order in orders[:3]) == ["A", "B", "C"]


def test_a_ratio_above_what_is_physically_possible_is_a_measurement_error():
    text = rollout.verdict([1.47, 1.40, 1.52], tolerance=0.05)
    assert text.startswith("MEASUREMENT ERROR (median 1.470 over 3 rounds, range 1.400-1.520)")


def test_noise_just_above_one_is_a_result_with_its_spread():
    assert rollout.verdict([0.98, 1.03, 0.99], tolerance=0.05) == "median 0.990 over 3 rounds, range 0.980-1.030"
    assert rollout.verdict([0.9, 1.2, 1.0], tolerance=0.05) == "median 1.000 over 3 rounds, range 0.900-1.200"


def test_one_round_says_its_spread_means_nothing():
    assert "fewer than 3 rounds" in rollout.verdict([0.93], tolerance=0.05)
