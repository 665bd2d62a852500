"""The reward workers for real (rlrun/task/pool.py, rlrun/entrypoints/reward_worker.py): processes
running a reward file of the test's own; a reward that raises, hangs, kills its process or prints
costs its own samples only (counted, scored by on_error), and the pool keeps answering and leaves
no process behind."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import psutil
import pytest

from rlrun.task.pool import RewardPool, Scorer
from rlrun.task.rewards import GroupCall, SampleInfo, reward_specs

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 2.0

REWARDS = '''
import os
import sys
import time
from pathlib import Path

print("printed while importing the rewards")  # must not land in a frame

MARKS = Path({marks!r})


def correct(completion, row):
    return float(completion == row["answer"])


def flaky(completion, row, info):
    if completion == "raise":
        raise ValueError("cannot parse " + completion)
    return 1.0


def slow(completion, row):
    if completion == "hang":
        time.sleep(60)
    return 0.5


def crash(completion, row):
    if completion == "crash":
        with open(MARKS / "crash-pids", "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        os.kill(os.getpid(), 9)
    if completion == "crash-once" and not (MARKS / "crashed-once").exists():
        (MARKS / "crashed-once").write_text(str(os.getpid()))
        os._exit(1)
    return 1.0


def chatty(completion, row):
    print("printed by a reward " * 2000)
    sys.stdout.write("\\x00\\x00\\x00\\x05junk")
    sys.stdout.flush()
    return 0.25


def group_length(prompts, completions, answer, **kwargs):
    return [None if c == "skip" else float(len(c)) for c in completions]
'''


def workers() -> list[psutil.Process]:
    """This test's reward worker processes still there, zombies (not reaped) included: by the
    title a worker gives itself (`rlrun:reward`), or by its command line before it has one."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name() == "rlrun:reward" or "rlrun.entrypoints.reward_worker" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.ZombieProcess:
            found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def rewards(tmp_path) -> Path:
    (tmp_path / "marks").mkdir()
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS.format(marks=str(tmp_path / "marks"))))
    return path


def call(texts: list[str]) -> GroupCall:
    infos = [SampleInfo("stop", 3, i, 0) for i in range(len(texts))]
    return GroupCall("2+3=", {"prompt": "2+3=", "answer": "5"}, texts, [[1, 2, 3]] * len(texts), infos)


async def scoring(rewards: Path, names: list[str], on_error: str = "zero", size: int = 2, weights=()):
    """A started pool and its scorer over `names` of the reward file."""
    specs = reward_specs([f"{rewards}:{n}" for n in names], list(weights))
    pool = RewardPool([s.ref for s in specs], size, TIMEOUT_S)
    await pool.start()
    return pool, Scorer(specs, pool, on_error)


def test_a_reward_that_raises_scores_zero_for_its_samples_and_is_counted(rewards, caplog):
    async def main():
        pool, scorer = await scoring(rewards, ["correct", "flaky"])
        try:
            score = await scorer.score(call(["5", "raise", "4", "raise"]))
            again = await scorer.score(call(["raise"]))
        finally:
            await pool.close()
        return pool, scorer, score, again

    pool, scorer, score, again = asyncio.run(main())
    assert pool.conventions == ["rlrun", "rlrun"]
    assert score.rewards == [2.0, 0.0, 1.0, 0.0]  # correct + flaky; the raising samples lose flaky's 1 only
    assert score.failures == [("flaky", "error"), ("flaky", "error")]
    assert again.rewards == [0.0]
    assert scorer.counters == {"reward_errors.flaky": 3}
    logged = [r.getMessage() for r in caplog.records if "reward" in r.getMessage() and "failed" in r.getMessage()]
    assert len(logged) == 1, "the first traceback of each kind is logged, the rest only counted"
    assert "reward_errors.flaky" in logged[0] and "ValueError: cannot parse raise" in logged[0]
    assert workers() == []


def test_a_reward_past_its_timeout_is_counted_and_its_worker_replaced(rewards):
    async def main():
        pool, scorer = await scoring(rewards, ["slow"], size=1)
        try:
            (first,) = [w.process.pid for w in pool._all]
            hung = await scorer.score(call(["hang", "fine"]))
            after = await scorer.score(call(["fine", "fine"]))
            now = {w.process.pid for w in pool._all}
        finally:
            await pool.close()
        return scorer, hung, after, first, now

    scorer, hung, after, first, now = asyncio.run(main())
    assert hung.rewards == [0.0, 0.5] and hung.failures == [("slow", "timeout")]
    assert after.rewards == [0.5, 0.5], "the pool stopped answering after a timeout"
    assert scorer.counters == {"reward_timeouts.slow": 1}
    assert first not in now and len(now) == 1, "the hung worker was not replaced"
    assert workers() == []


def test_a_worker_killed_under_a_call_is_retried_once_on_another_then_counted(rewards, tmp_path):
    async def main():
        pool, scorer = await scoring(rewards, ["crash"], size=2)
        try:
            killed = await scorer.score(call(["crash"]))
            once = await scorer.score(call(["crash-once"]))
            after = await scorer.score(call(["fine", "fine", "fine"]))
        finally:
            await pool.close()
        return scorer, killed, once, after

    scorer, killed, once, after = asyncio.run(main())
    pids = (tmp_path / "marks" / "crash-pids").read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2, f"the call ran on {pids}: not once more on another worker"
    assert killed.rewards == [0.0] and killed.failures == [("crash", "error")]
    assert once.rewards == [1.0] and once.failures == [], "a call whose first worker died was not given to another"
    assert (tmp_path / "marks" / "crashed-once").exists()
    assert after.rewards == [1.0, 1.0, 1.0]
    assert scorer.counters == {"reward_errors.crash": 1}
    assert workers() == []


def test_drop_group_drops_a_group_with_any_failure_and_keeps_the_others(rewards):
    async def main():
        pool, scorer = await scoring(rewards, ["correct", "flaky"], on_error="drop_group")
        try:
            return scorer, await scorer.score(call(["5", "raise"])), await scorer.score(call(["5", "4"]))
        finally:
            await pool.close()

    scorer, dropped, kept = asyncio.run(main())
    assert dropped.rewards is None and dropped.failures == [("flaky", "error")]
    assert kept.rewards == [2.0, 1.0]
    assert scorer.counters == {"reward_errors.flaky": 1}


def test_prints_in_a_reward_go_to_the_log_not_into_the_frames(rewards, capfd):
    async def main():
        pool, scorer = await scoring(rewards, ["chatty", "correct"], size=1)
        try:
            return scorer, [await scorer.score(call(["5", "4"])) for _ in range(3)]
        finally:
            await pool.close()

    scorer, scores = asyncio.run(main())
    assert [s.rewards for s in scores] == [[1.25, 0.25]] * 3
    assert scorer.counters == {}
    err = capfd.readouterr().err
    assert "printed while importing the rewards" in err and "printed by a reward" in err and "junk" in err


def test_a_trl_reward_is_called_once_per_group_and_weighted(rewards):
    async def main():
        pool, scorer = await scoring(rewards, ["correct", "group_length"], weights=[1.0, 0.5])
        try:
            return pool, await scorer.score(call(["5", "skip", "1234"]))
        finally:
            await pool.close()

    pool, score = asyncio.run(main())
    assert pool.conventions == ["rlrun", "trl"]
    assert score.rewards == [1.0 + 0.5 * 1, 0.0, 0.5 * 4]  # None (skip) adds nothing


def test_close_leaves_no_worker_even_with_a_replacement_pending(rewards):
    async def main():
        pool, scorer = await scoring(rewards, ["slow", "crash"], size=3)
        started = {w.process.pid for w in pool._all}
        assert {p.pid for p in workers()} == started
        await scorer.score(call(["hang"]))  # its worker is killed and a replacement started in the background
        await pool.close()
        return started

    started = asyncio.run(main())
    assert len(started) == 3
    assert workers() == []


def test_a_reward_file_that_no_longer_imports_is_a_task_input_error(rewards):
    from rlrun.task.rows import TaskInputError

    async def main():
        pool = RewardPool([f"{rewards}:no_such_reward"], 2, TIMEOUT_S)
        try:
            await pool.start()
        finally:
            await pool.close()

    with pytest.raises(TaskInputError, match="has no function 'no_such_reward'"):
        asyncio.run(main())
    assert workers() == []



# --- the environment's steps (environment=True) ------------------------------------------------------

STEPS = Path(__file__).resolve().parents[1] / "envs" / "steps.py"


def step_call(content: str, turn: int = 1):
    from rlrun.task.environment import StepCall, TurnInfo

    messages = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": content}]
    return StepCall(messages, {"prompt": "2+3=", "answer": "5"}, TurnInfo("run/4", 1, turn, "stop", 3, False))


async def stepping(names: list[str], calls: list[tuple[int, object]], size: int = 1):
    """The pool's conventions and each call's answer (or the CallFailed it raised), in order."""
    from rlrun.task.pool import CallFailed

    pool = RewardPool([f"{STEPS}:{n}" for n in names], size, TIMEOUT_S, environment=True)
    await pool.start()
    answers = []
    try:
        for index, c in calls:
            try:
                answers.append(await pool.call(index, c))
            except CallFailed as exc:
                answers.append(exc)
    finally:
        await pool.close()
    return pool.conventions, answers


def test_a_step_runs_in_a_worker_and_answers_its_steps_fields():
    conventions, answers = asyncio.run(stepping(["echo", "charge", "later"], [(0, step_call("4")), (0, step_call("5", turn=3)), (1, step_call("4")), (2, step_call("4"))]))
    assert conventions == [True, False, True]  # charge says it must not be run again after a crash
    observation, done, charged, awaited = answers
    assert observation == {"observation": "4|5|run/4#1", "role": "tool", "name": "echo", "done": False, "reward": None}
    assert done == {"observation": None, "role": "tool", "name": None, "done": True, "reward": 1.0}
    assert charged == {"observation": "charged", "role": "user", "name": None, "done": False, "reward": None}  # a Step
    assert awaited["done"] and awaited["reward"] == 0.25  # an async step
    assert workers() == []


@pytest.mark.parametrize(
    "name, problem",
    [
        ("number", "a step returns a dict or rlrun.task.environment.Step, not float"),
        ("misspelt", "the step answered unknown keys ['obs']"),
        ("no_observation", "a step that is not done answers an observation (text)"),
    ],
)
def test_a_step_answering_something_invalid_is_an_error_naming_the_problem(name, problem):
    _, (failed, again) = asyncio.run(stepping([name, "echo"], [(0, step_call("4")), (1, step_call("4"))]))
    assert type(failed).__name__ == "CallFailed" and failed.kind == "error"
    assert problem in failed.detail
    assert again["observation"] == "4|5|run/4#1", "the pool stopped answering after an invalid step"


def test_a_step_past_the_timeout_is_a_timeout_and_its_worker_replaced():
    _, (slept, after) = asyncio.run(stepping(["sleepy"], [(0, step_call("sleep")), (0, step_call("4"))]))
    assert type(slept).__name__ == "CallFailed" and slept.kind == "timeout"
    assert after["observation"] == "awake", "the pool stopped answering after a timeout"
    assert workers() == []


def test_a_step_with_the_wrong_signature_is_refused_when_the_pool_starts():
    from rlrun.task.rows import TaskInputError

    with pytest.raises(TaskInputError, match=r"two_arguments: a step takes \(messages, row, info\)"):
        asyncio.run(stepping(["two_arguments"], []))
    assert workers() == []


def test_a_step_served_over_http_is_posted_the_conversation_with_the_token(monkeypatch):
    """A verifier's own server (environment.step=http://...): a real HTTP server on loopback."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlrun.task.pool import CallFailed

    seen = []

    class Verifier(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.headers.get("Authorization"), body))
            ok = self.headers.get("Authorization") == "Bearer sesame"
            answer = {"done": True, "reward": float(body["messages"][-1]["content"] == body["row"]["answer"])}
            payload = json.dumps(answer if ok else {"error": "who are you"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Verifier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/step"

    async def ask(token: str):
        monkeypatch.setenv("RLRUN_ENVIRONMENT_TOKEN", token)  # the workers inherit it
        pool = RewardPool([url], 1, TIMEOUT_S, environment=True)
        await pool.start()
        try:
            return pool.conventions, [await pool.call(0, step_call("5")), await pool.call(0, step_call("4"))]
        except CallFailed as exc:
            return pool.conventions, exc
        finally:
            await pool.close()

    try:
        conventions, (right, wrong) = asyncio.run(ask("sesame"))
        _, refused = asyncio.run(ask("guess"))
    finally:
        server.shutdown()
    assert conventions == [True] and right["done"] and right["reward"] == 1.0 and wrong["reward"] == 0.0
    token, body = seen[0]
    assert token == "Bearer sesame" and body["row"] == {"prompt": "2+3=", "answer": "5"}
    assert body["info"]["group_id"] == "run/4" and body["messages"][-1] == {"role": "assistant", "content": "5"}
    assert refused.kind == "error" and "answered 401" in refused.detail
    assert workers() == []


def test_a_step_whose_worker_dies_runs_again_only_if_it_may(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("RLRUN_STEP_CALLS", str(calls))
    _, (rerun, once) = asyncio.run(stepping(["dies", "dies_charging"], [(0, step_call("4")), (1, step_call("4"))], size=2))
    assert rerun.kind == "error" and once.kind == "interrupted" and "must not be run again" in once.detail
    assert calls.read_text().count("run/4") == 3  # twice for the one that may run again, once for the other
    assert workers() == []
