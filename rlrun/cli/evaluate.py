"""`rlrun eval RUN_DIR [--step N]`: the held-out evaluation of a checkpoint, after the fact, with the
code the run evaluates with (`rlrun/actor/evaluator.py`, the run's rewards in their worker pool).

It starts one vLLM server of its own (the run's settings, on a free loopback port, the run's API
key) serving the checkpoint's weights, measures that version, stops the server, and returns the
figures beside the run's own evaluation of that version when there is one. Every eval request is
seeded (the prompt's own seed), so the two agree exactly, at any eval.temperature. The run directory is only read; the server's log goes to a
temporary folder, kept and named if the server fails.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from rlrun.errors import ConfigError, EnvironmentProblem
from rlrun.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    checkpoint: Path
    version: int
    figures: dict  # rlrun.task.evaluation.summarize's, with version, eval_s, time
    in_run: Optional[dict]  # the run's own record of that version (metrics.jsonl, kind "eval"), if any
    warnings: list[str] = field(default_factory=list)


def evaluate(run_root: Path, step: Optional[int] = None) -> Evaluation:
    """Evaluate run `run_root`'s newest usable checkpoint (or step `step`'s) on its held-out rows."""
    from rlrun.actor.conversation import conversations_for
    from rlrun.actor.evaluator import evaluator_for
    from rlrun.actor.tokenizer import load_tokenizer
    from rlrun.cli.export import chosen_checkpoint
    from rlrun.config.compose import load_resolved
    from rlrun.models.chat import chat_renderer
    from rlrun.models.source import model_path
    from rlrun.task.pool import scorer_for
    from rlrun.task.tasks import load_task
    from rlrun.telemetry.metrics import eval_records
    from rlrun.trainer import checkpoint

    run = RunDir(Path(run_root).expanduser().resolve())
    run.require_run()
    cfg = load_resolved(run.config)
    if cfg.eval.every_steps == 0:  # the keys still say how (k, temperature, ...): the defaults
        log.info("the run had no evaluation (eval.every_steps=0): evaluating with the eval.* settings it has")
    task = load_task(cfg.dataset, cfg.run.seed, cfg.reward, scored_by_environment=bool(cfg.environment.step))
    if not task.eval_problems:
        raise ConfigError(
            f"{run.root}'s task has no held-out rows (dataset.eval_files, eval_split or eval_fraction): nothing to evaluate."
        )
    warnings: list[str] = []
    source = chosen_checkpoint(run, step, warnings)
    version = checkpoint.read_state(source).policy_version
    base = model_path(cfg.model, build=False, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)
    tokenizer = load_tokenizer(source if checkpoint.has_tokenizer(source) else base)
    render = chat_renderer(source if checkpoint.has_tokenizer(source) else base) if cfg.model.chat_template else None
    scorer = scorer_for(task.rewards, cfg.reward)
    conversations = conversations_for(cfg, str(source if checkpoint.has_tokenizer(source) else base), tokenizer)
    key = run.read_vllm_api_key()
    logs = Path(tempfile.mkdtemp(prefix="rlrun-eval-"))
    try:
        with _server(cfg, run, source, base, logs) as url:
            evaluator = evaluator_for(cfg, task.eval_problems, tokenizer, render, scorer, None, [url], conversations)
            figures = asyncio.run(_measure(evaluator, scorer, url, key, version))
    except BaseException:
        log.error("the evaluation's vLLM log is kept in %s", logs)
        raise
    shutil.rmtree(logs, ignore_errors=True)
    in_run = next((r for r in eval_records(run.metrics) if r["policy_version"] == version), None)
    return Evaluation(source, version, figures, in_run, warnings)


async def _measure(evaluator, scorer, url: str, key: str, version: int) -> dict:
    import httpx

    from rlrun.inference.auth import bearer_header

    pools = [scorer.pool] + ([evaluator.conversations.pool] if evaluator.conversations else [])
    for pool in pools:
        await pool.start()
    try:
        async with httpx.AsyncClient(headers=bearer_header(key) if key else {}) as client:
            return await evaluator.measure(client, version)
    finally:
        for pool in pools:
            await pool.close()


class _server:
    """One vLLM server of the run's settings serving `weights`, supervised, ready on entry."""

    def __init__(self, cfg, run: RunDir, weights: Path, tokenizer: str, logs: Path) -> None:
        self.cfg, self.run, self.weights, self.tokenizer, self.logs = cfg, run, weights, tokenizer, logs
        self._context: AbstractContextManager | None = None

    def __enter__(self) -> str:
        from rlrun.inference import server
        from rlrun.streams.server import pick_free_port
        from rlrun.supervisor import ProcessSpec, supervised

        host = self.cfg.inference.host
        port = pick_free_port(host)
        url = server.base_url(host, port)
        argv = server.server_argv(
            replace(self.cfg.inference, num_servers=1),
            self.cfg.model,
            str(self.weights),
            port,
            tokenizer=self.tokenizer,
            stream_interval=self.cfg.actor.journal_flush_tokens,
            host=host,
        )
        spec = ProcessSpec(
            name="vllm-eval",
            argv=argv,
            log_path=self.logs / "vllm-eval.log",
            env=server.server_env(self.cfg.inference),
            secret_env={"VLLM_API_KEY": self.run.vllm_api_key},
            ready=server.HealthCheck(url),
            ready_timeout_s=self.cfg.inference.ready_timeout_s,
        )
        self._context = supervised(spec)
        try:
            self._context.__enter__()
        except Exception as exc:
            raise EnvironmentProblem(
                f"the evaluation's vLLM server did not start ({exc}); its log: {self.logs / 'vllm-eval.log'}"
            ) from None
        return url

    def __exit__(self, *exc) -> None:
        assert self._context is not None  # set by __enter__
        self._context.__exit__(*exc)
