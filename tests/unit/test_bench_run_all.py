"""bench/run_all: figures read from each script's printed output, failures shown in the table."""

from __future__ import annotations

import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "run_all"


@pytest.fixture(scope="module")
def run_all():
    loader = SourceFileLoader("bench_run_all", str(PATH))
    module = module_from_spec(spec_from_loader("bench_run_all", loader))
    sys.modules["bench_run_all"] = module  # its dataclasses look their module up by name
    loader.exec_module(module)
    yield module
    sys.modules.pop("bench_run_all", None)


ROLLOUT = """\
load average at start: 0.90/1.68/2.42
machine: 2 CPUs, Intel(R) Xeon(R) Processor; load average now 3.10/2.16/2.52 (1/5/15 min)
shape: 256 groups x n=16, max_tokens=4, 16 groups in flight, journal_flush_tokens=16, vLLM threads=1, appendfsync=everysec
round | A vLLM tok/s | B actor+journal | C actor, no journal |   B/A |   B/C |   C/A |      tokens A/B/C |      wall s A/B/C | load
------------------------------------------------------------------------------------------------------------------------------------
    1 |         1643 |            1536 |                1522 |  0.94 |  1.01 |  0.93 |  9943/10099/10005 |  6.05/ 6.57/ 6.57 | 1.50
    2 |         1754 |             816 |                1325 |  0.47 |  0.62 |  0.76 | 10053/10385/10193 |  5.73/12.73/ 7.69 | 2.56
------------------------------------------------------------------------------------------------------------------------------------
  all |         1697 |            1061 |                1416 |  0.63 |  0.75 |  0.83 |  (tokens / wall time over all rounds)
 med. |              |                 |                     |  0.70 |  0.81 |  0.84 |  (median of the per-round ratios)
range |    1643-1754 |        816-1536 |           1325-1522 | 0.47-0.94 | 0.62-1.01 | 0.76-0.93 |  (min-max over the rounds)
B/A = actor with journal vs vLLM alone: 0.625; B/C = journal overhead (target >= 0.97): 0.750
verdict B/A (actor with journal vs vLLM alone): median 0.705 over 2 rounds, range 0.470-0.940 (fewer than 3 rounds: no spread worth the name)
verdict B/C (journal overhead (target >= 0.97)): median 0.815 over 2 rounds, range 0.620-1.010 (fewer than 3 rounds: no spread worth the name)
verdict C/A (actor without journal vs vLLM alone): median 0.845 over 2 rounds, range 0.760-0.930 (fewer than 3 rounds: no spread worth the name)
"""

RECOVERY = """\
load average at start: 3.10/2.16/2.52 (1/5/15 min), 2 CPUs
  SIGKILL vllm-0 (pid 4242) at step 3 with 260 tokens in flight; load 2.00/2.00/2.00

run: exit code 0, 20 steps in 312 s, group size 8, max_new_tokens 48, load average now 2.50/2.40/2.30
(a) token reuse across a SIGKILL (tokens journaled before the kill, groups in flight at the kill)
    victim  | in flight | groups | samples | streamed |   kept | not deliv. |  reuse | load at kill
    vllm-0  |       260 |      8 |      64 |      260 |    260 |          0 | 1.0000 | 2.00/2.00/2.00
    actor   |       230 |      8 |      64 |      230 |    225 |          0 | 0.9783 | 2.10/2.00/2.00
    last actor's counters: {'groups_published': 40}
(b) recovery time, s (from events.jsonl; the supervisor polls every 0.5 s, the guard every 0.2 s)
    victim  | kill->failed | failed->restarted | restarted->ready | failed->ready | kill->tokens again | reason
    vllm-0  |         0.41 |              1.00 |            31.20 |         32.20 |              33.00 | killed by SIGKILL
    actor   |         0.30 |              1.00 |             0.00 |          1.00 |               2.10 | killed by SIGKILL
(c) supervisor overhead (CPU % of one core, psutil, 1 s samples)
    5 samples over steps 6->8, load after 2.40/2.30/2.20
    rlrun train itself : mean CPU   3.2 %, max RSS   95.1 MB
    its 4 guards       : mean CPU   0.8 % (all together), max RSS   60.0 MB together,  15.0 MB the largest
    whole process tree : mean CPU 180.0 %, max RSS 3000.0 MB (RSS summed, shared pages counted twice)
    rlrun + guards share of the tree's CPU: 2.2 %
"""

REDIS_LOSS = """\
summary (acked / restored / lost in tokens for journal, entries for rpush):
  journal everysec: mean   1804 appends/s (1.00 x everysec), 0/1 kills lost data, 0 tokens lost in all, worst window 0.0 ms, mean restart 0.55 s
  rpush   always  : mean    294 appends/s (0.08 x everysec), 0/1 kills lost data, 0 entries lost in all, worst window 0.0 ms, mean restart 0.06 s
machine: 2 CPUs; load average now 6.32/5.13/3.86
"""

STEP_TIME = """\
run: /tmp/rl4  steps 1..200 (200 records)
step 1 step_time_s (start-up, excluded): 11.97
seconds per step (steps 2..200): median 0.798, mean 0.996, p90 1.729
steps/minute from `time` (step 1 -> 200, 199.0 s): 60.0
reward_mean: first 10 steps 0.2781, last 10 steps 0.7067
"""


def figures(rows) -> dict[str, str]:
    return {r.figure: r.value for r in rows}


def test_rollout_ratios_come_from_the_all_row(run_all):
    got = figures(run_all.parse_rollout(ROLLOUT))
    assert got["tokens/s, vLLM alone (A)"] == "1697"
    assert got["ratio B/A: actor vs vLLM alone"] == "0.63"
    assert got["ratio B/C: journal overhead (target >= 0.97)"] == "0.75"
    notes = {r.figure: r.note for r in run_all.parse_rollout(ROLLOUT)}
    assert notes["ratio B/C: journal overhead (target >= 0.97)"] == "median per round 0.81; range 0.62-1.01"


def test_an_impossible_rollout_ratio_is_reported_as_a_measurement_error(run_all):
    text = ROLLOUT.replace(
        "verdict B/A (actor with journal vs vLLM alone): median 0.705",
        "verdict B/A (actor with journal vs vLLM alone): MEASUREMENT ERROR (median 1.470",
    )
    rows = {r.figure: r for r in run_all.parse_rollout(text)}
    assert rows["ratio B/A: actor vs vLLM alone"].value == "MEASUREMENT ERROR"
    assert rows["ratio B/A: actor vs vLLM alone"].note.startswith("MEASUREMENT ERROR (median 1.470")
    assert rows["ratio B/C: journal overhead (target >= 0.97)"].value == "0.75"  # the others stay figures


def test_recovery_reuse_times_and_supervisor_overhead(run_all):
    got = figures(run_all.parse_recovery(RECOVERY))
    assert got["token reuse ratio, SIGKILL vllm-0"] == "1.0000"
    assert got["token reuse ratio, SIGKILL actor"] == "0.9783"
    assert got["vllm-0: kill -> failure detected (s)"] == "0.41"
    assert got["actor: failure -> ready again (s)"] == "1.00"
    assert got["vllm-0: kill -> tokens flowing again (s)"] == "33.00"
    assert got["supervisor (rlrun train): CPU % of a core"] == "3.2"
    assert got["its guard processes: CPU % (all)"] == "0.8"
    assert got["supervisor + guards share of all CPU used (%)"] == "2.2"


def test_redis_loss_summary_lines_and_step_time(run_all):
    got = figures(run_all.parse_redis_loss(REDIS_LOSS))
    assert got == {"journal, appendfsync everysec": "1804 appends/s (1.00 x everysec)", "rpush, appendfsync always": "294 appends/s (0.08 x everysec)"}
    got = figures(run_all.parse_step_time(STEP_TIME))
    assert got["s per trainer step (median)"] == "0.798" and got["steps per minute (wall clock)"] == "60.0"


def test_a_failing_script_shows_as_failed_with_its_last_line_and_the_others_still_count(run_all, tmp_path):
    failed = run_all.with_figures(
        run_all.run("rollout", [sys.executable, "-c", "print('vLLM never became healthy'); raise SystemExit(3)"], tmp_path / "rollout.log", 60)
    )
    assert (failed.status, failed.code) == ("FAILED", 3)
    assert (failed.rows[0].figure, failed.rows[0].note) == ("FAILED", "vLLM never became healthy")
    ok = run_all.with_figures(run_all.run("redis_loss", [sys.executable, "-c", f"print({REDIS_LOSS!r})"], tmp_path / "redis_loss.log", 60))
    assert ok.status == "ok" and len(ok.rows) == 2
    table = run_all.render([failed, ok], run_all.machine(), "1.00/1.00/1.00", "2.00/2.00/2.00", 60.0)
    assert "FAILED (" in table and "vLLM never became healthy" in table and "1804 appends/s" in table
    assert "cpu " in table and "load     1.00/1.00/1.00 before -> 2.00/2.00/2.00 after" in table


def test_a_script_past_its_timeout_is_stopped_and_shown_as_timeout(run_all, tmp_path):
    outcome = run_all.with_figures(run_all.run("recovery", [sys.executable, "-c", "import time; print('waiting', flush=True); time.sleep(60)"], tmp_path / "r.log", 1.0))
    assert outcome.status == "TIMEOUT" and outcome.seconds < 30
    assert outcome.rows[0].figure == "TIMEOUT"


def test_output_without_figures_points_at_the_log(run_all, tmp_path):
    outcome = run_all.with_figures(run_all.run("step_time", [sys.executable, "-c", "print('nothing useful')"], tmp_path / "s.log", 60))
    assert outcome.rows[0].figure == "no figures found in its output" and str(tmp_path) in outcome.rows[0].note
