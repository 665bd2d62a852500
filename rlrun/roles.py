"""The processes of a run as supervisor specs: Redis → vLLM servers → trainer → actor.

Each role's command line, environment, log file, readiness and liveness probes and restart
policy are decided here from the typed config; the trainer's processes come from its backend
(`rlrun.backends`). rlrun's own children start from their role file (`rlrun/role_file.py`).
"""

from __future__ import annotations

from rlrun.actor.partition import actor_name, servers_of
from rlrun.backends import backend_for
from rlrun.config import RunConfig
from rlrun.inference import server as vllm_server
from rlrun.role_parts import Endpoints, RedisProbe, child_env, restart_policy, role_command
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.supervisor import ProcessSpec


def build_specs(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, model_path: str) -> list[ProcessSpec]:
    sup = cfg.supervisor
    grace = sup.stop_grace_s
    probe = RedisProbe(endpoints.redis_url, run_dir)
    specs: list[ProcessSpec] = []
    if endpoints.redis_port is not None:
        binary = redis_server.find_server_binary(cfg.streams.server)
        specs.append(
            ProcessSpec(
                name="redis",
                argv=redis_server.server_argv(binary, run_dir),
                log_path=run_dir.log("redis"),
                ready=probe.ping,
                alive=probe.ping,
                ready_timeout_s=sup.ready_timeout_s,
                stop_grace_s=grace,
                restart=restart_policy(sup.redis),
                stall_timeout_s=sup.redis.stall_timeout_s,
            )
        )
    for i, url in enumerate(endpoints.vllm_urls):
        port = int(url.rsplit(":", 1)[1])
        specs.append(
            ProcessSpec(
                name=f"vllm-{i}",
                # Started (and restarted) from the newest weights the trainer published.
                argv=vllm_server.server_argv(cfg.inference, cfg.model, str(run_dir.current_weights), port, tokenizer=model_path),
                env=vllm_server.server_env(cfg.inference),
                secret_env={"VLLM_API_KEY": run_dir.vllm_api_key},  # every route but /health (rlrun.inference.auth)
                log_path=run_dir.log(f"vllm-{i}"),
                ready=vllm_server.HealthCheck(url),
                alive=vllm_server.HealthCheck(url),
                ready_timeout_s=cfg.inference.ready_timeout_s,
                stop_grace_s=grace,
                restart=restart_policy(sup.vllm),
                stall_timeout_s=sup.vllm.stall_timeout_s,
            )
        )
    specs += backend_for(cfg).specs(cfg, run_dir, endpoints, model_path, probe)  # the trainer and what serves it
    k_all = cfg.actor.num_actors
    for k in range(k_all):  # each with its own servers, prompts, journal and state (rlrun/actor/partition.py)
        urls = [endpoints.vllm_urls[i] for i in servers_of(k, k_all, len(endpoints.vllm_urls))]
        name = actor_name(k, k_all)
        argv, write_role_file = role_command(
            run_dir, "rlrun.actor.main", name, redis_url=endpoints.redis_url, model_path=model_path, vllm_urls=urls, actor_index=k
        )
        specs.append(
            ProcessSpec(
                name=name,
                argv=argv,
                before_start=write_role_file,
                env=child_env(1),
                log_path=run_dir.log(name),
                alive=lambda pid, key=names.actor_state(k, k_all): probe.heartbeat(key, pid),
                stop_grace_s=grace,
                finishes=True,
                restart=restart_policy(sup.actor),
                stall_timeout_s=sup.actor.stall_timeout_s,
            )
        )
    return specs
