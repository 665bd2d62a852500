"""Fast-LLM's weight follower process (trainer=fast_llm): `python -m rlrun.entrypoints.weights
RUN/roles/weights.yaml`. The follower itself: `rlrun/backends/fast_llm/follower.py`."""

from __future__ import annotations

import logging

from rlrun.backends.fast_llm.follower import VllmBroadcastAdmin, WeightFollower
from rlrun.backends.fast_llm.installed import store_host
from rlrun.entrypoints import configure_logging, exit_2_on, run_process
from rlrun.errors import ConfigError
from rlrun.parts.role_file import role_from_argv
from rlrun.streams.server import connect

log = logging.getLogger("rlrun.weights")


@exit_2_on(log, ConfigError)
def main(argv: list[str] | None = None) -> int:
    configure_logging()
    role = role_from_argv("rlrun::weights", argv)
    cfg = role.load_config()
    run_dir = role.run
    redis = connect(role.redis_url, run_dir.read_redis_password())
    admin = VllmBroadcastAdmin(
        role.vllm_urls, receive_timeout_s=cfg.trainer.fast_llm.timeout_s, api_key=run_dir.read_vllm_api_key()
    )
    try:
        host_store = store_host(cfg) == "rlrun"  # who serves the broadcast's store: the installed Fast-LLM says
        WeightFollower(
            cfg.trainer,
            redis,
            admin,
            role.broadcast_host,
            role.broadcast_port,
            host_store,
            model_dtype=cfg.model.dtype,
        ).run_forever()
    finally:
        admin.close()
        redis.close()
    return 0


if __name__ == "__main__":
    run_process(main, "weights")  # `ps` shows rlrun:weights
