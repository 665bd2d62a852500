"""The processes of a run as supervisor specs: Redis → vLLM servers → trainer → actor.

Each role's command line, environment, log file and readiness probe are decided here, from the
typed config; the supervisor only ever sees the resulting specs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rlrun.config import RunConfig
from rlrun.inference import server as vllm_server
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.supervisor import ProcessSpec


@dataclass(frozen=True)
class Endpoints:
    """Where the run's services listen (ports chosen by the launcher)."""

    redis_url: str
    redis_port: int | None  # None when streams.url names an external server
    vllm_urls: list[str]


def child_env(threads: int) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def build_specs(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, model_path: str) -> list[ProcessSpec]:
    grace = cfg.supervisor.stop_grace_s
    password = _password_reader(run_dir)
    specs: list[ProcessSpec] = []
    if endpoints.redis_port is not None:
        binary = redis_server.find_server_binary(cfg.streams.server)
        specs.append(
            ProcessSpec(
                name="redis",
                argv=redis_server.server_argv(binary, run_dir),
                log_path=run_dir.log("redis"),
                ready=lambda: redis_server.ping(endpoints.redis_url, password()),
                ready_timeout_s=cfg.supervisor.ready_timeout_s,
                stop_grace_s=grace,
            )
        )
    for i, url in enumerate(endpoints.vllm_urls):
        port = int(url.rsplit(":", 1)[1])
        specs.append(
            ProcessSpec(
                name=f"vllm-{i}",
                argv=vllm_server.server_argv(cfg.inference, cfg.model, model_path, port),
                env=vllm_server.server_env(cfg.inference),
                log_path=run_dir.log(f"vllm-{i}"),
                ready=lambda url=url: vllm_server.healthy(url),
                ready_timeout_s=cfg.inference.ready_timeout_s,
                stop_grace_s=grace,
            )
        )
    common = ["--run-dir", str(run_dir.root), "--redis-url", endpoints.redis_url, "--model-path", model_path]
    vllm_args = [arg for url in endpoints.vllm_urls for arg in ("--vllm-url", url)]
    specs.append(
        ProcessSpec(
            name="trainer",
            argv=[sys.executable, "-m", "rlrun.trainer.main", *common, *vllm_args],
            env=child_env(cfg.trainer.threads),
            log_path=run_dir.log("trainer"),
            ready=lambda: _hash_field(endpoints.redis_url, password(), names.TRAINER_STATE, "ready") == "1",
            ready_timeout_s=cfg.supervisor.ready_timeout_s,
            stop_grace_s=grace,
            finishes=True,
        )
    )
    specs.append(
        ProcessSpec(
            name="actor",
            argv=[sys.executable, "-m", "rlrun.actor.main", *common, *vllm_args],
            env=child_env(1),
            log_path=run_dir.log("actor"),
            stop_grace_s=grace,
            finishes=True,
        )
    )
    return specs


def _password_reader(run_dir: RunDir):
    def read() -> str | None:
        try:
            return run_dir.redis_password.read_text().strip()
        except OSError:
            return None

    return read


def _hash_field(url: str, password: str | None, key: str, field: str) -> str | None:
    try:
        client = redis_server.connect(url, password)
        try:
            return client.hget(key, field)
        finally:
            client.close()
    except Exception:  # a probe never raises: not reachable means not ready
        return None
