"""trainer=fast_llm with the real Fast-LLM (ServiceNow/Fast-LLM), when one is on this machine.

Opt-in: set RLRUN_FAST_LLM_PATH to a folder holding a `fast-llm` program (and, if Fast-LLM's
torch is not rlrun's, its `torchrun`), e.g. a venv's bin/ with Fast-LLM installed. Skipped (the
reason printed) otherwise; CI runs the stand-in (test_fast_llm_e2e.py). Fast-LLM runs on the CPU
here (trainer.device=cpu: gloo, no CUDA), the weight broadcast crosses into vLLM's torch.

    RLRUN_FAST_LLM_PATH=/path/to/fast-llm-venv/bin ./scripts/test tests/e2e/test_fast_llm_real.py -s
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rlrun import completion
from rlrun.backends.fast_llm.checkpoints import latest_complete_step, read_metadata
from rlrun.rundir import RunDir
from rlrun.streams.server import connect
from rlrun.streams.standalone import managed_server

from .conftest import events, left_behind, start_rlrun, wait_or_kill

pytestmark = pytest.mark.e2e

STEPS = 4
FAST_LLM = os.environ.get("RLRUN_FAST_LLM_PATH")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    if not FAST_LLM or shutil.which("fast-llm", path=FAST_LLM) is None:
        reason = "set RLRUN_FAST_LLM_PATH to a folder with Fast-LLM's `fast-llm` program to run this test"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    run_dir = tmp_path_factory.mktemp("fast_llm_real") / "run"
    env = {"PATH": f"{FAST_LLM}{os.pathsep}{os.environ['PATH']}"}
    proc = start_rlrun(
        run_dir, "trainer=fast_llm", "trainer.device=cpu", "recipe=math_gspo", f"trainer.max_train_steps={STEPS}",
        "trainer.checkpoint_every=2", "trainer.train_batch_size=64", env=env,
    )  # fmt: skip
    wait_or_kill(proc, 1500)
    with managed_server(RunDir(run_dir)) as srv:
        client = connect(srv.url, srv.password)
        fl_events = [json.loads(f["event"]) for _id, f in client.xrange("fast_llm_events")]
    return proc.returncode, run_dir, fl_events, left_behind(proc)


def test_the_real_fast_llm_ends_at_exactly_train_iters(real_run):
    code, run_dir, fl_events, left = real_run
    assert code == 0, (run_dir.parent / "rlrun.out").read_text()[-3000:]
    assert latest_complete_step(run_dir / "fast_llm") == STEPS
    assert fl_events[-1] == {"type": "training_finished"}
    assert left == []
    log = (run_dir / "logs" / "launch-1" / "weights.log").read_text()
    ready = [e for e in fl_events if e["type"] == "weights_ready"]
    assert log.count("vLLM serves step") == len(ready) == STEPS + 1


def test_the_sample_counting_rule_would_have_stopped_the_real_one_early(real_run):
    _, run_dir, fl_events, _ = real_run
    seen = {e["step"]: e["documents_seen"] for e in fl_events if e["type"] == "weights_ready" and "documents_seen" in e}
    if not seen:
        pytest.skip("this Fast-LLM revision does not report documents_seen (PR #502's head)")
    target = completion.HfTarget(STEPS, 64, 1)
    fired = [s for s in sorted(seen) if completion.hf_finished(target, completion.TrainerObservation(seen[s], 0, False, s)).finished]
    print(f"documents per step: {[seen[s] - seen.get(s - 1, 0) for s in sorted(seen) if s]}; "
          f"sample counting would have stopped at step {fired[0] if fired else None} of {STEPS}")  # fmt: skip
    assert fired and fired[0] < STEPS
    assert read_metadata(run_dir / "fast_llm" / "checkpoint" / str(STEPS)).documents_seen == seen[STEPS]
    rewinds = [e for e in events(run_dir) if e["event"] == "documents_rewound"]
    assert rewinds and all(r.get("lost") in (0, None) for r in rewinds)
