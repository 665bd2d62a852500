"""bench/gpu_check.py in its CPU mode, as CI runs it, so it cannot rot: every part passes on this
machine's CPU (NCCL skipped), its report says what it compared, and a part that never ends is
killed at its cap and reported, not waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402 - bench/ is not a package

pytestmark = pytest.mark.timeout(240)


def test_the_cpu_mode_check_passes_and_reports_each_part(tmp_path):
    report_path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--json", str(report_path)],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    parts = {p["name"]: p for p in report["parts"]}
    assert report["mode"] == "cpu" and report["ok"]
    assert {name: p["status"] for name, p in parts.items()} == {"versions": "pass", "step": "pass", "checkpoint": "pass", "nccl": "skip"}
    assert parts["versions"]["figures"]["torch"] and parts["versions"]["figures"]["python"]
    step = parts["step"]["figures"]
    assert set(step) == {"fp32", "fp32+ac", "bf16+ac", "reference_loss"} and step["reference_loss"] != 0.0
    assert step["fp32"]["weights_max_abs_diff"] <= 2e-5 and step["bf16+ac"]["weights_agreeing"] >= 0.9
    assert step["bf16+ac"]["loss"] != step["fp32"]["loss"]  # bf16 computed in bf16: not the fp32 step again
    ckpt = parts["checkpoint"]["figures"]
    assert ckpt["shards"] == ["__0_0.distcp", "__1_0.distcp"] and ckpt["problem"] is None  # two ranks, sharded
    assert ckpt["max_diff"] <= 1e-6 and ckpt["moved"] > gpu_check.LR / 2  # resumed = uninterrupted, and the step moved
    for name in ("versions", "step", "checkpoint"):
        assert name in done.stdout and parts[name]["detail"] in done.stdout  # the table


def test_a_part_that_never_ends_is_killed_at_its_cap_and_fails_the_check(tmp_path):
    report = gpu_check.check("cpu", ["_hang"], {"_hang": 5.0}, tmp_path)
    (part,) = report["parts"]
    assert part["status"] == "timeout" and "cap of 5 s" in part["detail"] and not report["ok"]
    pid = int((tmp_path / "_hang" / "hang.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed with its process group, and reaped
