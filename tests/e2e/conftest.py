"""Helpers for end-to-end tests: run the real `rlrun` CLI and find what it left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

from tests.processes import ProcessCollector, listening_sockets

E2E_DIR = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items) -> None:
    """Every test in tests/e2e runs the full stack: marked `e2e` whether its module says so or not,
    so `pytest -m "not e2e"` (the fast lane) never starts one."""
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


class RunProcesses(ProcessCollector):
    """Every process that descends from one `rlrun` process, collected while it runs.
    `listening`: every TCP socket they were seen listening on (sampled every LISTEN_EVERY_S:
    listeners live as long as a run)."""

    LISTEN_EVERY_S = 2.0

    def __init__(self, root_pid: int) -> None:
        self.cmdlines: set[tuple[str, ...]] = set()  # every command line `ps` showed, while they ran
        self.listening: dict[tuple[str, int], str] = {}
        self._listened_at = 0.0
        self._root = root_pid
        super().__init__()

    def _look(self) -> bool:
        import time

        try:
            children = psutil.Process(self._root).children(recursive=True)
        except psutil.Error:
            return False
        for proc in children:
            try:
                self.seen.add((proc.pid, proc.create_time()))
                self.cmdlines.add(tuple(proc.cmdline()))
            except psutil.Error:
                pass
        if time.monotonic() - self._listened_at >= self.LISTEN_EVERY_S:
            self.listening.update(listening_sockets([self._root, *(proc.pid for proc in children)]))
            self._listened_at = time.monotonic()
        return True


def run_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `rlrun ARGS` to its end; `.left_behind` lists its descendants still alive after it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    tracker = RunProcesses(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        tracker.stop()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    result.left_behind = tracker.alive()
    result.cmdlines = sorted(tracker.cmdlines)
    result.listening = dict(tracker.listening)
    return result


def _default_sigint() -> None:
    """rlrun as a terminal starts it: a pytest started in the background by a shell without job
    control ignores SIGINT, and a child would inherit that (tests send SIGINT as Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_rlrun(run_dir: Path, *args: str, command: str = "train", env: dict | None = None) -> subprocess.Popen:
    """Start `rlrun train run.dir=RUN ARGS` (or `rlrun resume RUN ARGS`) in the background.

    Its output goes to RUN/../rlrun.out; `.run_processes` tracks its descendants."""
    log = open(run_dir.parent / "rlrun.out", "a")
    argv = ["train", f"run.dir={run_dir}", *args] if command == "train" else ["resume", str(run_dir), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, preexec_fn=_default_sigint,
    )  # fmt: skip
    proc.run_processes = RunProcesses(proc.pid)
    return proc


def wait_or_kill(proc: subprocess.Popen, timeout: float) -> int:
    """Wait for an rlrun started by `start_rlrun`; one still running after `timeout` is killed
    (and the test fails with TimeoutExpired)."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def left_behind(proc: subprocess.Popen, grace_s: float = 5.0) -> list[str]:
    """Descendants of a finished (or killed) rlrun still alive after `grace_s`."""
    proc.run_processes.stop()
    return proc.run_processes.alive(grace_s)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file. A last line without its newline is left out: read while
    a process of the run appends to it, the file may end mid-line (a reader can see a write before
    all of it is in, a long line such as an audit record's more often)."""
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def events(run_dir: Path) -> list[dict]:
    """The run's events.jsonl so far ([] before it exists)."""
    path = run_dir / "events.jsonl"
    return read_jsonl(path) if path.is_file() else []


def steps_done(run_dir: Path) -> int:
    """The last step in the run's metrics.jsonl (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    return max((m["step"] for m in read_jsonl(path)), default=0) if path.is_file() else 0


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    """Poll `condition` until it holds; fail naming `what` on a timeout or when rlrun exits."""
    import time

    deadline = time.time() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"rlrun exited ({proc.returncode}) while waiting for {what}")
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def leaked_secrets(run_dir: Path, cmdlines, outputs: tuple[str, ...] = ()) -> list[str]:
    """Where the run's Redis password or vLLM API key shows up: in a command line one of its
    processes had, in a file of the run (other than secrets/ and the 0600 redis.conf, which exist
    to hold them), or in the given outputs (rlrun's stdout/stderr)."""
    secrets = {
        "Redis password": (run_dir / "secrets" / "redis.password").read_text().strip(),
        "vLLM API key": (run_dir / "secrets" / "vllm.key").read_text().strip(),
    }
    assert all(len(value) >= 16 for value in secrets.values()), "the run has no generated secrets"
    private = {run_dir / "secrets", run_dir / "redis" / "redis.conf"}
    found = []
    for name, value in secrets.items():
        found += [f"{name} on the command line {' '.join(c)[:100]}" for c in cmdlines if value in " ".join(c)]
        found += [f"{name} in rlrun's output" for text in outputs if value in text]
        for path in run_dir.rglob("*"):
            if path.is_file() and not any(p == path or p in path.parents for p in private):
                if value.encode() in path.read_bytes():
                    found.append(f"{name} in {path.relative_to(run_dir)}")
    return found



_SUMMARIES: list[tuple[str, list[str]]] = []


def summary(title: str, lines: list[str]) -> None:
    """Print `lines` under `title` at the end of the session (pytest's terminal summary): figures
    such as the fault matrix's ETTR table are seen without `-s`, also when a test fails."""
    _SUMMARIES.append((title, list(lines)))


def pytest_terminal_summary(terminalreporter) -> None:
    for title, lines in _SUMMARIES:
        terminalreporter.section(title, sep="-")
        for line in lines:
            terminalreporter.write_line(line)


def current_pid(run_dir: Path, process: str) -> int:
    """The pid of the process itself (the child of the guard that leads its group)."""
    started = [e for e in events(run_dir) if e["event"] in ("process_started", "process_restarted") and e["process"] == process]
    guard = psutil.Process(started[-1]["pid"])
    wait_for(guard.children, 30, f"the guard of {process} to start it")  # just restarted: not yet
    return guard.children()[0].pid


def restarts(run_dir: Path, process: str) -> int:
    return sum(1 for e in events(run_dir) if e["event"] == "process_restarted" and e["process"] == process)


# The long-generations run of the recovery tests: the actor's audit trail (actor.audit=true)
# records every batch of tokens it journaled and every group it delivered.
STEPS = 5
BUDGET = 48

MIN_TOKENS = 40
LONG_GENERATIONS = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=64", "trainer.checkpoint_every=100",
    f"actor.max_new_tokens={BUDGET}", f"actor.min_new_tokens={MIN_TOKENS}", "actor.audit=true", "actor.max_prefix_staleness=1000",
    "actor.max_concurrent_groups=8", "supervisor.stop_grace_s=5",
]  # fmt: skip


def audit(run_dir: Path, actor: str = "actor") -> list[dict]:
    """The audit trail of one actor process (actor.audit=true)."""
    path = run_dir / "audit" / f"{actor}.jsonl"
    return read_jsonl(path) if path.is_file() else []


def in_flight_tokens(run_dir: Path, actor: str = "actor") -> int:
    """Tokens `actor` journaled for groups not delivered yet."""
    records = audit(run_dir, actor)
    delivered = {r["group_id"] for r in records if r["kind"] == "delivered"}
    return sum(len(r["token_ids"]) for r in records if r["kind"] == "journaled" and r["group"] not in delivered)


def samples_mid_generation(run_dir: Path, actor: str = "actor") -> int:
    """Samples of undelivered groups with some but fewer than `MIN_TOKENS` tokens journaled: none of
    them can have finished (no end of sequence before MIN_TOKENS)."""
    records = audit(run_dir, actor)
    delivered = {r["group_id"] for r in records if r["kind"] == "delivered"}
    held: dict[tuple[str, int], int] = {}
    for r in records:
        if r["kind"] == "journaled" and r["group"] not in delivered:
            key = (r["group"], r["index"])
            held[key] = max(held.get(key, 0), r["offset"] + len(r["token_ids"]))
    return sum(1 for n in held.values() if 0 < n < MIN_TOKENS)


def kill_mid_generation(run_dir: Path, process: str, proc: subprocess.Popen, actor: str = "actor", tokens: int = 100,
                        timeout: float = 600) -> float:  # fmt: skip
    """SIGKILL `process` (vLLM or `actor`) while some of `actor`'s samples are mid-generation and at
    least `tokens` tokens of undelivered groups are journaled; the time.

    A group of the tiny model streams out in a fraction of a second, so a kill timed by polling
    finds nothing in flight as often as not. Frozen first (SIGSTOP), the victim sends or takes no
    token between the check and the kill; thawed (SIGCONT) and tried again when nothing is mid-way.
    """
    import time

    pid = current_pid(run_dir, process)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rlrun exited ({proc.returncode}) before {process} could be killed mid-generation")
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)  # tokens already received reach the journal (a frozen vLLM sends no more)
        if samples_mid_generation(run_dir, actor) > 0 and in_flight_tokens(run_dir, actor) >= tokens:
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            return killed_at
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
    raise AssertionError(f"no sample was mid-generation within {timeout} s")


def check_exact_continuation(run_dir: Path, killed_at: float) -> dict:
    """Every token journaled before or after the kill is exactly where it ended up for training.

    Each audited batch must equal the delivered sample at its offset (tokens and log-probs): a
    regenerated prefix would differ there. The batches must cover the sample, except for at most
    one batch per sample whose audit line was lost when its writer was SIGKILLed after the
    journal append (the journal, not the audit, is the source of truth).
    """
    records = audit(run_dir)
    batches = defaultdict(list)
    for r in records:
        if r["kind"] == "journaled":
            batches[(r["group"], r["index"])].append(r)
    delivered = [r for r in records if r["kind"] == "delivered"]
    ids = [g["group_id"] for g in delivered]
    assert len(ids) == len(set(ids)), "a group was delivered twice"
    spanning = 0
    for group in delivered:
        for sample in group["samples"]:
            name = f"{group['group_id']}/{sample['index']}"
            tokens, logprobs = sample["completion_ids"], sample["logprobs"]
            assert len(tokens) <= BUDGET  # the budget holds across continuations
            chain = batches[(group["group_id"], sample["index"])]
            covered = set()
            for batch in chain:
                end = batch["offset"] + len(batch["token_ids"])
                assert tokens[batch["offset"] : end] == batch["token_ids"], f"{name}: tokens at {batch['offset']} were regenerated"
                assert logprobs[batch["offset"] : end] == batch["logprobs"], f"{name}: log-probs at {batch['offset']} changed"
                covered.update(range(batch["offset"], end))
            holes = sorted(set(range(len(tokens))) - covered)
            assert not holes or holes == list(range(holes[0], holes[-1] + 1)), f"{name}: scattered gaps {holes}"
            if chain and chain[0]["time"] < killed_at < chain[-1]["time"]:
                spanning += 1
    return {"delivered": set(ids), "spanning": spanning}


def trained_once(run_dir: Path, delivered: set[str], steps: int = STEPS) -> None:
    """Every step 1..steps trained in the final lineage, no group twice, each one delivered."""
    final_steps = {}
    for line in read_jsonl(run_dir / "trained_groups.jsonl"):
        final_steps[line["step"]] = line["groups"]  # a step retrained after a restart replaces the first
    trained = [g for groups in final_steps.values() for g in groups]
    assert sorted(final_steps) == list(range(1, steps + 1))
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert set(trained) <= delivered
