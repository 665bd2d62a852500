"""Fast-LLM's own YAML config, generated from the run's config, and the command that launches it.

Every key written here was checked against ServiceNow/Fast-LLM's sources (main, 2025, the version
with the Redis streaming dataset and the `streaming` trainer callback; `trainer.fast_llm.version`):

- `training.train_iters`, `training.checkpoint.{interval,keep}`:
  fast_llm/engine/training/config.py (TrainingConfig, TrainingCheckpointConfig).
- `schedule.docs_per_step`: fast_llm/engine/schedule/config.py, exercised by Fast-LLM's
  tests/test_docs_per_step.py (`Trainer._prefetch_to_doc_target` pulls whole micro-batches until
  the global document count reaches it: it overshoots).
- `data.datasets.training: {type: streaming, host, port, timeout}`:
  fast_llm/data/dataset/config.py (StreamingDatasetConfig extends RedisConfig: host, port,
  timeout=600); `data.micro_batch_size` (tokens), `data.maximum_document_length`,
  `data.truncate_documents`: SamplingConfigBase, and docs/quick-start.md.
- `callbacks.streaming: {type: streaming, host, port, timeout, broadcast: {host, port, backend,
  external_world_size}, export: {format}}`: fast_llm/engine/training/streaming.py and
  tests/models/test_streaming.py.
- `model.base_model.head.losses.<name>: {type: grpo, policy_loss: grpo|gspo, epsilon_low,
  epsilon_high, temperature}`: fast_llm/layers/language_model/loss/config.py
  (LanguageModelGRPOLossConfig) and fast_llm/layers/language_model/config.py (head.losses).
- `optimizer.{learning_rate.base, beta_1, beta_2, weight_decay, gradient_norm_clipping}`:
  fast_llm/engine/optimizer/config.py.
- `pretrained.{format, path, model_weights}`, `run.experiment_dir`,
  `model.distributed.compute_dtype`: docs/quick-start.md.

Redis is given by host and port only: Fast-LLM's clients (`redis.Redis(host, port)`) send no
password, so the run's Redis grants them a restricted passwordless user (see `acl`). Fast-LLM reads
its config strictly, so a key it does not know fails its start: extra keys go through
`trainer.fast_llm.extra`, merged last.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from rlrun.config.schema import RunConfig
from rlrun.errors import EnvironmentProblem

# Fast-LLM's docs: "The Python hash seed must be set to 0 ... Training will fail if this isn't set."
LAUNCH_ENV = {"PYTHONHASHSEED": "0"}

_COMPUTE_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def docs_per_step(cfg: RunConfig) -> int:
    """Documents Fast-LLM is asked to take per optimizer step (it takes a few more)."""
    explicit = cfg.trainer.fast_llm.docs_per_step
    return cfg.trainer.samples_per_step if explicit is None else explicit


def data_parallel(cfg: RunConfig) -> int:
    """Data-parallel ranks reading the stream (the stand-in trainer simulates this many)."""
    f = cfg.trainer.fast_llm
    return f.nproc_per_node if f.data_parallel is None else f.data_parallel


def broadcast_backend(cfg: RunConfig) -> str:
    """torch.distributed backend of the weight broadcast: gloo on CPU, NCCL on GPUs."""
    chosen = cfg.trainer.fast_llm.broadcast_backend
    if chosen != "auto":
        return chosen
    return "gloo" if cfg.trainer.device == "cpu" else "nccl"


def fast_llm_config(
    cfg: RunConfig,
    *,
    redis_host: str,
    redis_port: int,
    experiment_dir: Path,
    model_path: str,
    broadcast_host: str,
    broadcast_port: int,
) -> dict[str, Any]:
    """Fast-LLM's config for this run, as plain data (see the module docstring for the sources)."""
    t, a, f = cfg.trainer, cfg.algo, cfg.trainer.fast_llm
    timeout = float(f.timeout_s)
    generated: dict[str, Any] = {
        "run": {"experiment_dir": str(experiment_dir)},
        "pretrained": {"format": f.checkpoint_format, "path": str(model_path), "model_weights": True},
        "model": {
            "base_model": {
                "head": {
                    "losses": {
                        "grpo": {
                            "type": "grpo",
                            "policy_loss": a.name,  # "grpo" (token ratios) or "gspo" (sequence ratio)
                            "epsilon_low": a.clip_eps_low,
                            "epsilon_high": a.clip_eps_high,
                            # new log-probs at the actor's sampling temperature, like the old ones
                            "temperature": cfg.actor.temperature,
                        }
                    }
                }
            },
            "distributed": {"compute_dtype": _COMPUTE_DTYPE[cfg.model.dtype]},
        },
        "training": {
            "train_iters": t.max_train_steps,
            # Fast-LLM also saves at the last step and when interrupted (SIGINT/SIGTERM).
            "checkpoint": {"interval": t.checkpoint_every, "keep": t.keep_checkpoints},
        },
        "schedule": {"docs_per_step": docs_per_step(cfg)},
        "data": {
            "micro_batch_size": f.micro_batch_size,  # tokens
            "maximum_document_length": cfg.model.max_model_len,
            "truncate_documents": False,  # a rollout is trained whole or not at all
            "datasets": {
                "training": {"type": "streaming", "host": redis_host, "port": redis_port, "timeout": timeout},
            },
        },
        "optimizer": {
            "learning_rate": {"base": t.lr},
            "beta_1": t.betas[0],
            "beta_2": t.betas[1],
            "weight_decay": t.weight_decay,
            "gradient_norm_clipping": t.grad_clip,
        },
        "callbacks": {
            "streaming": {
                "type": "streaming",
                "host": redis_host,
                "port": redis_port,
                "timeout": timeout,
                "broadcast": {
                    "host": broadcast_host,
                    "port": broadcast_port,
                    "backend": broadcast_backend(cfg),
                    # the receivers: one rank per vLLM server (Fast-LLM's rank 0 makes it +1)
                    "external_world_size": cfg.inference.num_servers,
                },
                "export": {"format": f.checkpoint_format},
            }
        },
    }
    return _merged(generated, f.extra)


def write_config(
    cfg: RunConfig,
    path: Path,
    *,
    redis_host: str,
    redis_port: int,
    experiment_dir: Path,
    model_path: str,
    broadcast_host: str,
    broadcast_port: int,
) -> Path:
    """Write Fast-LLM's config to `path` (YAML, atomically) and return `path`. It holds no secret."""
    data = fast_llm_config(
        cfg,
        redis_host=redis_host,
        redis_port=redis_port,
        experiment_dir=experiment_dir,
        model_path=model_path,
        broadcast_host=broadcast_host,
        broadcast_port=broadcast_port,
    )
    header = (
        f"# Fast-LLM config generated by rlrun for Fast-LLM {cfg.trainer.fast_llm.version} from the run's "
        "config.\n# Change the run's config (trainer.*), not this file: it is rewritten at every start.\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)
    return path


def launch_argv(cfg: RunConfig, config_path: Path) -> list[str]:
    """`trainer.fast_llm.command` with {nproc}, {config} and {data_parallel} filled in."""
    f = cfg.trainer.fast_llm
    values = {"{nproc}": str(f.nproc_per_node), "{config}": str(config_path), "{data_parallel}": str(data_parallel(cfg))}
    argv = []
    for arg in f.command:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        argv.append(arg)
    return argv


def ensure_launchable(argv: list[str]) -> None:
    """Raise EnvironmentProblem naming what is missing when `argv` cannot start Fast-LLM here.

    Checks the program and, for `torchrun --no_python <program>`, the program torchrun runs.
    `--dry-run` does not call this: it only shows the command.
    """
    needed = [argv[0]] if argv else []
    if argv and Path(argv[0]).name == "torchrun" and "--no_python" in argv:
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if rest:
            needed.append(rest[0])
    missing = [name for name in needed if shutil.which(name) is None and not _is_executable(name)]
    if missing:
        raise EnvironmentProblem(
            f"cannot start Fast-LLM: {', '.join(missing)} not found (command: {' '.join(argv)}). Install "
            "Fast-LLM on a machine with GPUs (pip install 'fast-llm[CORE,OPTIONAL]', see "
            "https://servicenow.github.io/Fast-LLM/), or set trainer.fast_llm.command, or use trainer=hf."
        )


def _is_executable(name: str) -> bool:
    path = Path(name)
    return os.sep in name and path.is_file() and os.access(path, os.X_OK)


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in recursively (mappings merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
