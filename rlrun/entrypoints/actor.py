"""The actor process: `python -m rlrun.entrypoints.actor RUN/roles/actor.yaml` (`actor-<k>.yaml`:
actor k of actor.num_actors). The actor itself: `rlrun/actor/loop.py`."""

from __future__ import annotations

import logging
import signal
from functools import partial

from rlrun.actor.conversation import conversations_for
from rlrun.actor.evaluator import evaluator_for
from rlrun.actor.ledger import JournalLedger, MemoryLedger
from rlrun.actor.loop import Actor
from rlrun.actor.partition import group_namespace
from rlrun.actor.tokenizer import load_tokenizer
from rlrun.entrypoints import configure_logging, die_of, exit_2_on, run_process, run_until_sigterm
from rlrun.errors import ConfigError, ExitCode
from rlrun.models.chat import chat_renderer
from rlrun.parts.generation_flags import GenerationFlags
from rlrun.parts.role_file import role_from_argv
from rlrun.run.built import build
from rlrun.streams import names
from rlrun.streams.names import actor_name
from rlrun.streams.server import connect, stop_retrying
from rlrun.task.pool import scorer_for
from rlrun.task.tasks import load_task

log = logging.getLogger("rlrun.actor")


@exit_2_on(log, ConfigError)  # e.g. vLLM refuses the requests this config makes
def main(argv: list[str] | None = None) -> int:
    configure_logging()
    role = role_from_argv("rlrun::actor", argv)
    cfg = role.load_config()
    task = load_task(cfg.dataset, cfg.run.seed, cfg.reward, scored_by_environment=bool(cfg.environment.step))
    render_prompt = chat_renderer(role.model_path) if cfg.model.chat_template else None
    run_dir, k = role.run, role.actor_index
    if not 0 <= k < cfg.actor.num_actors:
        log.error(
            "%s: actor_index %d is not an actor of this run (actor.num_actors=%d)", role.name, k, cfg.actor.num_actors
        )
        return int(ExitCode.USAGE)
    redis = connect(role.redis_url, run_dir.read_redis_password())
    flags = (
        GenerationFlags(run_dir.generation_flags, cfg.actor.num_actors) if cfg.world.cpu_affinity == "by_need" else None
    )
    try:
        tokenizer = load_tokenizer(role.model_path)  # not transformers: see tokenizer.py
        view = build(cfg).backend.trainer_view(redis, k)  # the role's run, built once
        ledger = JournalLedger(redis, names.journal_prefix(view.stream)) if cfg.actor.journal else MemoryLedger(redis)
        scorer = scorer_for(task.rewards, cfg.reward)
        conversations = conversations_for(cfg, role.model_path, tokenizer)
        evaluator = None
        if k == 0 and cfg.eval.every_steps and task.eval_problems:  # actor 0 evaluates
            evaluator = evaluator_for(
                cfg, task.eval_problems, tokenizer, render_prompt, scorer, redis, role.vllm_urls, conversations
            )
        actor = Actor(
            cfg.actor,
            cfg.algo,
            redis,
            tokenizer,
            task,
            role.vllm_urls,
            ledger,
            run_name=group_namespace(run_dir.root.name, k, cfg.actor.num_actors),
            api_key=run_dir.read_vllm_api_key(),
            seed=cfg.run.seed,
            trainer=view,
            scorer=scorer,
            actor_index=k,
            render_prompt=render_prompt,
            evaluator=evaluator,
            conversations=conversations,
            generating=partial(flags.set, k) if flags is not None else None,
        )
        if cfg.actor.audit:
            run_dir.audit.mkdir(exist_ok=True)
            actor.audit_path = run_dir.audit / f"{actor_name(k, cfg.actor.num_actors)}.jsonl"
        stopped = run_until_sigterm(actor.run(), on_stop=lambda: stop_retrying(redis))
    finally:
        redis.close()
        if flags is not None:
            flags.close()
    if stopped:
        die_of(signal.SIGTERM)
    return 0


if __name__ == "__main__":
    run_process(main, "actor")  # `ps` shows rlrun:actor
