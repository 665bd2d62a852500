"""bench/gpu_check.py in its CPU mode, as CI runs it, so it cannot rot: every part passes on this
machine's CPU (NCCL and the end-to-end run skipped, saying why), its report says what it compared,
and a part that never ends is killed at its cap and reported, not waited for. What only a GPU
shows (NCCL, bf16 on CUDA, MFU, vLLM) is left to a run on one (bench/README.md)."""

from __future__ import annotations

import importlib.util
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
    assert {name: p["status"] for name, p in parts.items()} == {
        "versions": "pass", "step": "pass", "checkpoint": "pass", "trainer": "pass", "throughput": "pass", "nccl": "skip",
        "e2e": "skip",
    }  # fmt: skip
    assert parts["versions"]["figures"]["torch"] and parts["versions"]["figures"]["python"]
    step = parts["step"]["figures"]
    assert set(step) == {"fp32", "fp32+ac", "bf16+ac", "reference_loss"} and step["reference_loss"] != 0.0
    assert step["fp32"]["weights_max_abs_diff"] <= 2e-5 and step["bf16+ac"]["weights_agreeing"] >= 0.9
    assert step["bf16+ac"]["loss"] != step["fp32"]["loss"]  # bf16 computed in bf16: not the fp32 step again
    ckpt = parts["checkpoint"]["figures"]
    assert ckpt["ranks"] == 2
    for sharding in ("fsdp2", "ddp"):  # two ranks each, every rank writing its optimizer shard
        got = ckpt[sharding]
        assert (
            got["sharding"] == sharding and got["shards"] == ["__0_0.distcp", "__1_0.distcp"] and got["problem"] is None
        )
        assert (
            got["max_diff"] <= 1e-6 and got["moved"] > gpu_check.LR / 2
        )  # resumed = uninterrupted, and the step moved
    assert ckpt["fsdp2_vs_ddp"] <= 2e-5  # sharded and replicated take the same step
    trainer = parts["trainer"]["figures"]
    steps, after = gpu_check.TRAINER_STEPS["cpu"]
    assert trainer["exit_codes"] == [0, 0] and trainer["stopped_at_step"] == after  # SIGTERM: exit 0, mid-run
    assert trainer["checkpoint_at_stop"] == f"step_{trainer['stopped_at_step']:06d}"
    assert trainer["trained_steps"] == list(range(1, steps + 1))  # resumed at the next step: none lost, none twice
    tiny = parts["throughput"]["figures"]["tiny"]
    assert tiny["s_per_step"] > 0 and tiny["tokens_per_s"] == pytest.approx(
        tiny["tokens_per_step"] / tiny["s_per_step"], rel=0.01
    )
    assert "mfu" not in tiny and "peak_memory_gib" not in tiny  # CUDA only
    assert "no CUDA" in parts["e2e"]["detail"] and parts["e2e"]["seconds"] == 0.0  # skipped without a process
    for name in ("versions", "step", "checkpoint", "trainer", "throughput", "e2e"):
        assert name in done.stdout and parts[name]["detail"] in done.stdout  # the table


def test_a_part_that_never_ends_is_killed_at_its_cap_and_fails_the_check(tmp_path):
    report = gpu_check.check("cpu", ["_hang"], {"_hang": 5.0}, tmp_path)
    (part,) = report["parts"]
    assert part["status"] == "timeout" and "cap of 5 s" in part["detail"] and not report["ok"]
    pid = int((tmp_path / "_hang" / "hang.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed with its process group, and reaped


def test_the_end_to_end_part_says_why_it_cannot_run(tmp_path):
    assert "no CUDA" in gpu_check.e2e_skip_reason("cpu", vllm_installed=True)
    assert "vLLM is not installed" in gpu_check.e2e_skip_reason("cuda", vllm_installed=False)
    assert gpu_check.e2e_skip_reason("cuda", vllm_installed=True) is None
    assert gpu_check.part_e2e("cpu", tmp_path).status == "skip"  # run as a part by hand: no run started
    assert not any(tmp_path.iterdir())
    if importlib.util.find_spec("vllm") is None:  # this machine: CUDA asked for, vLLM missing
        (part,) = gpu_check.check("cuda", ["e2e"], {"e2e": 5.0}, tmp_path)["parts"]
        assert part["status"] == "skip" and "vLLM is not installed" in part["detail"]


def test_mfu_uses_the_gpus_peak_and_is_not_given_for_an_unknown_gpu():
    assert gpu_check.peak_bf16_tflops("NVIDIA H200") == 989.0
    assert gpu_check.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu_check.peak_bf16_tflops("NVIDIA L40S") == 362.0 and gpu_check.peak_bf16_tflops("NVIDIA L4") == 121.0
    assert gpu_check.peak_bf16_tflops("NVIDIA GeForce RTX 3090") is None
    # 135M parameters, 32k tokens in 0.1 s on 989 TFLOPs: 6 * 1.35e8 * 32768 / 0.1 / 9.89e14 = 26.8 %
    assert gpu_check.mfu(135_000_000, 32_768, 0.1, 989.0) == pytest.approx(0.2684, abs=1e-4)
    assert gpu_check.mfu(135_000_000, 32_768, 0.1, None) is None
