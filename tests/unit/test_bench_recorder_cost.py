"""bench/recorder_cost.py at tiny sizes: it runs, and both modes write the same ETTR."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import recorder_cost  # noqa: E402 - bench/ is not a package


def test_both_modes_record_the_same_ettr_at_every_size(capsys):
    assert recorder_cost.main(["--sizes", "3,40", "--steps", "2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["3", "40"]
    assert all(row[-1] == "same" for row in rows), rows


def test_the_running_figures_are_the_whole_historys():
    _, _, whole = recorder_cost.measure(30, 3, "whole")
    _, _, running = recorder_cost.measure(30, 3, "running")
    assert running == whole and all(isinstance(f, float) and 0 < f < 1 for f in running)
