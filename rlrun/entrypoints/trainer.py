"""The hf trainer process: `python -m rlrun.entrypoints.trainer RUN/roles/trainer.yaml`, one per
rank (rank 0 reads every actor's stream). The loop itself: `rlrun/trainer/loop.py`."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from rlrun.entrypoints import configure_logging, exit_2_on, run_process
from rlrun.errors import ConfigError
from rlrun.inference.admin import VllmAdmin
from rlrun.listen import run_prefix
from rlrun.parts.role_file import role_from_argv
from rlrun.streams.server import connect, stop_retrying
from rlrun.trainer import checkpoint
from rlrun.trainer.disk import DiskFull
from rlrun.trainer.loop import Trainer
from rlrun.trainer.parallel import Parallel, Ranks, collective_backend, usable_device

log = logging.getLogger("rlrun.trainer")


@exit_2_on(log, ConfigError, checkpoint.CorruptCheckpoint, DiskFull)
def main(argv: list[str] | None = None) -> int:
    configure_logging()
    redis = vllm = parallel = broadcast = shared = trainer = flags = None
    stop = (
        threading.Event()
    )  # SIGTERM (the supervisor's orderly stop, a SLURM job's end): stop at the next step boundary
    clients: list[Any] = []  # Redis clients: stopping, a Redis that stopped with us is not waited for

    def on_sigterm(*_) -> None:
        stop.set()
        for client in clients:
            stop_retrying(client)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        role = role_from_argv("rlrun::trainer", argv)
        cfg, run_dir = role.load_config(), role.run
        # One rank unless a launcher (rlrun.entrypoints.rank_group, torchrun) set RANK/WORLD_SIZE.
        ranks = Ranks.from_env(os.environ)
        device = usable_device(ranks.device(cfg.trainer.device))  # no such device here: exit 2
        checkpoint.resume_point(run_dir.checkpoints)  # damaged checkpoints: exit 2 before any server is asked
        redis = connect(role.redis_url, run_dir.read_redis_password())
        clients.append(redis)
        vllm = VllmAdmin(role.vllm_urls, api_key=run_dir.read_vllm_api_key())
        store_prefix = run_prefix(run_dir.read_vllm_api_key()) if ranks.distributed else ""  # keys of the ranks' store
        parallel = Parallel(ranks, cfg.trainer.sharding, device, store_prefix)
        if cfg.trainer.weight_transfer == "broadcast" and parallel.ranks.is_main:
            from rlrun.trainer.weight_broadcast import BroadcastSync

            broadcast = BroadcastSync(
                vllm,
                role.broadcast_host,
                role.broadcast_port,
                collective_backend(cfg.trainer.device),
                cfg.trainer.weight_sync_timeout_s,
                prefix=run_prefix(run_dir.read_vllm_api_key()),
            )
        if cfg.trainer.weight_transfer == "shm" and parallel.ranks.is_main:
            from rlrun.weights.shared import SharedWeights, shared_path

            shared = SharedWeights(shared_path(run_prefix(run_dir.read_vllm_api_key())))
        threads = None
        if cfg.world.cpu_affinity == "by_need":
            from rlrun.parts.generation_flags import GenerationFlags
            from rlrun.trainer.core_share import threads_by_need

            flags = GenerationFlags(run_dir.generation_flags, cfg.actor.num_actors)
            threads = threads_by_need(flags, cfg.trainer.threads)
        trainer = Trainer(cfg, run_dir, redis, role.model_path, vllm, parallel, broadcast, stop, shared, threads)
        trainer.train()
    finally:
        for part in (trainer, broadcast, shared, vllm, parallel, redis, flags):
            if part is not None:
                part.close()
    return 0


def _title() -> str:
    """`trainer`, or `trainer-rank<r>` for rank r of several."""
    rank = os.environ.get("RANK") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    return f"trainer-rank{rank}" if rank else "trainer"


if __name__ == "__main__":
    run_process(main, _title())  # `ps` shows rlrun:trainer (-rank1...)
