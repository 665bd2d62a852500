"""The processes of a run as supervisor specs: Redis → vLLM servers → trainer → actor.

Each role's command line, environment, log file, readiness and liveness probes and restart
policy are decided here from the typed config; the trainer's processes come from its backend,
bound into the built run (`rlrun.run.built`). rlrun's own children start from their role file (`rlrun/parts/role_file.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlrun.actor.partition import servers_of
from rlrun.cluster.gpus import NOT_PLACED, GpuPlan, on_gpus
from rlrun.inference import server as vllm_server
from rlrun.parts.role_parts import Endpoints, RedisProbe, child_env, role_command, role_spec
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.streams.names import actor_name
from rlrun.supervisor import EventLog, ProcessSpec

if TYPE_CHECKING:  # pragma: no cover - types only
    from rlrun.run.built import BuiltRun


def build_specs(
    built: "BuiltRun",
    run_dir: RunDir,
    endpoints: Endpoints,
    model_path: str,
    events: EventLog,
    gpus: GpuPlan = NOT_PLACED,
) -> list[ProcessSpec]:
    """The run's processes in start order; their hooks record what they do in `events`, the
    supervisor's log. `gpus`: world=local's GPUs of each process (`World.gpu_plan`), narrowed in
    its environment (CUDA_VISIBLE_DEVICES)."""
    cfg = built.cfg
    probe = RedisProbe(endpoints.redis_url, run_dir)
    specs: list[ProcessSpec] = []
    if endpoints.redis_port is not None:
        binary = redis_server.find_server_binary(cfg.streams.server)
        argv = redis_server.server_argv(binary, run_dir)
        specs.append(
            role_spec(cfg.supervisor, run_dir, "redis", "redis", argv=argv, ready=probe.ping, alive=probe.ping)
        )
    for i, url in enumerate(endpoints.vllm_urls):
        port = int(url.rsplit(":", 1)[1])
        specs.append(
            role_spec(
                cfg.supervisor,
                run_dir,
                f"vllm-{i}",
                "vllm",
                # Started (and restarted) from the newest weights the trainer published.
                argv=vllm_server.server_argv(
                    cfg.inference,
                    cfg.model,
                    str(run_dir.current_weights),
                    port,
                    tokenizer=model_path,
                    stream_interval=cfg.actor.journal_flush_tokens,
                    host=endpoints.host(f"vllm-{i}", cfg.inference.host),
                    gpu_use=built.world.vllm_gpu_use(gpus, f"vllm-{i}"),
                ),
                env=vllm_server.server_env(cfg.inference),
                secret_env={"VLLM_API_KEY": run_dir.vllm_api_key},  # every route but /health (rlrun.inference.auth)
                ready=vllm_server.HealthCheck(url),
                alive=vllm_server.HealthCheck(url),
                ready_timeout_s=cfg.inference.ready_timeout_s,
            )
        )
    specs += built.backend.specs(run_dir, endpoints, model_path, probe, events)  # the trainer and what serves it
    k_all = cfg.actor.num_actors
    for k in range(k_all):  # each with its own servers, prompts, journal and state (rlrun/actor/partition.py)
        urls = [endpoints.vllm_urls[i] for i in servers_of(k, k_all, len(endpoints.vllm_urls))]
        name = actor_name(k, k_all)
        argv, write_role_file = role_command(
            run_dir,
            "rlrun.entrypoints.actor",
            name,
            redis_url=endpoints.redis_url,
            model_path=model_path,
            vllm_urls=urls,
            actor_index=k,
        )
        specs.append(
            role_spec(
                cfg.supervisor,
                run_dir,
                name,
                "actor",
                argv=argv,
                before_start=write_role_file,
                env=child_env(1),
                finishes=True,
                alive=lambda pid, key=names.actor_state(k, k_all): probe.heartbeat(key, pid),
            )
        )
    if gpus.on_gpus:  # each on its GPUs, restarted once their memory is back
        specs = [on_gpus(spec, gpus, events.emit, cfg.world.gpu_release_timeout_s) for spec in specs]
    return specs
