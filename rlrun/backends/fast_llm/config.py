"""Fast-LLM's own YAML config, generated from the run's config, and the command that launches it.

Every key was accepted by Fast-LLM's validation at each commit of `revisions.REVISIONS` (where
Fast-LLM reads each one: docs/architecture.md). Redis by host and port only (no password: see
`acl`); `trainer.fast_llm.extra` is merged last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import yaml

from rlrun.backends.fast_llm.revisions import Revision
from rlrun.config.problems import Problems
from rlrun.config.schema import RunConfig, TrainerConfig
from rlrun.errors import ConfigError
from rlrun.rundir import write_atomic

# Fast-LLM's docs: "The Python hash seed must be set to 0 ... Training will fail if this isn't set."
LAUNCH_ENV = {"PYTHONHASHSEED": "0"}

_COMPUTE_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Fast-LLM's Hugging Face converters named after the `model_type` of the config.json they read
# (its own `auto` maps model_type to these names; at every commit of `revisions.REVISIONS`).
CONVERTERS = ("llama", "qwen2", "mistral", "mixtral")


def config_problems(cfg: RunConfig) -> list[str]:
    """What trainer=fast_llm's own settings get wrong, and what it cannot run with (several actors,
    an external Redis), one sentence each (asked by preflight)."""
    from rlrun.backends.fast_llm.revisions import AUTO, NAMES

    t, f = cfg.trainer, cfg.trainer.fast_llm
    problems = Problems()
    need = problems.need
    need(
        cfg.eval.every_steps == 0,
        f"eval.every_steps={cfg.eval.every_steps}: held-out evaluation holds rlrun's trainer's weight updates while a version "
        "is evaluated, and Fast-LLM pushes its weights itself; with trainer=fast_llm set eval.every_steps=0 (evaluate a "
        "checkpoint's export instead)",
    )
    need(
        f.version == AUTO or f.version in NAMES,
        f"trainer.fast_llm.version={f.version} is not a Fast-LLM revision rlrun drives: choose {AUTO} (ask the "
        f"installed Fast-LLM) or one of {', '.join(NAMES)} (rlrun/backends/fast_llm/revisions.py).",
    )
    need(
        t.gradient_accumulation_passes == 1,
        f"trainer.gradient_accumulation_passes={t.gradient_accumulation_passes} has no effect with "
        "trainer=fast_llm: Fast-LLM ignores it and takes schedule.docs_per_step documents per step. "
        "Set trainer.gradient_accumulation_passes=1 and trainer.fast_llm.docs_per_step="
        f"{t.train_batch_size * t.gradient_accumulation_passes} (or trainer.train_batch_size) instead.",
    )
    need(
        f.micro_batch_size >= cfg.model.max_model_len,
        f"trainer.fast_llm.micro_batch_size ({f.micro_batch_size} tokens) must hold a whole document of "
        f"model.max_model_len ({cfg.model.max_model_len}) tokens: Fast-LLM skips documents that do not fit.",
    )
    need(
        any("{config}" in arg for arg in f.command),
        f"trainer.fast_llm.command must pass the generated config file with a {{config}} placeholder (got {f.command}).",
    )
    names = (f.stream, f.consumer_group, f.events_stream)
    need(
        all(names) and f.stream != f.events_stream,
        "trainer.fast_llm.stream and trainer.fast_llm.events_stream must be two different non-empty names "
        f"(got {f.stream!r}, {f.events_stream!r}).",
    )
    need(
        bool(f.experiment_dir_name) and "/" not in f.experiment_dir_name,
        f"trainer.fast_llm.experiment_dir_name must be a plain folder name (got {f.experiment_dir_name!r}).",
    )
    need(
        f.train_iters is None or f.train_iters == t.max_train_steps,
        f"trainer.fast_llm.train_iters ({f.train_iters}) disagrees with trainer.max_train_steps "
        f"({t.max_train_steps}): rlrun sets Fast-LLM's training.train_iters from "
        "trainer.max_train_steps, and the run is complete only when Fast-LLM reaches it. Set "
        "trainer.max_train_steps to the step count you want and remove trainer.fast_llm.train_iters.",
    )
    k = cfg.actor.num_actors
    need(
        k <= 1,
        f"actor.num_actors={k} needs trainer=hf: Fast-LLM reads one stream, and each actor delivers into its "
        "own (so that its journal and its stream share one Redis Cluster slot). Use actor.num_actors=1 with "
        "trainer=fast_llm.",
    )
    need(
        cfg.streams.url is None,
        "trainer=fast_llm needs the run's own Redis (it grants Fast-LLM's passwordless clients a restricted user "
        "of their own): unset streams.url.",
    )
    return problems


def docs_per_step(cfg: RunConfig) -> int:
    """Documents Fast-LLM is asked to take per optimizer step (it takes a few more)."""
    explicit = cfg.trainer.fast_llm.docs_per_step
    return cfg.trainer.samples_per_step if explicit is None else explicit


def checkpoint_format(cfg: RunConfig, model_path: str | Path) -> str:
    """Fast-LLM's converter for the model folder: trainer.fast_llm.checkpoint_format, or with `auto`
    the folder's model_type. Resolved here, not left to Fast-LLM's own `auto`, because the weight
    broadcast exports in this format too. ConfigError (exit 2) when `auto` cannot tell."""
    chosen = cfg.trainer.fast_llm.checkpoint_format
    if chosen != "auto":
        return chosen
    config_json = Path(model_path) / "config.json"
    try:
        model_type = json.loads(config_json.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"trainer.fast_llm.checkpoint_format=auto reads the model's config.json, and {config_json} could not be "
            f"read ({exc}). Set trainer.fast_llm.checkpoint_format to Fast-LLM's converter for the model "
            f"({', '.join(CONVERTERS)}, ...)."
        ) from None
    if model_type not in CONVERTERS:
        raise ConfigError(
            f"trainer.fast_llm.checkpoint_format=auto: the model's config.json ({config_json}) has model_type "
            f"{model_type!r}, not one rlrun maps to a Fast-LLM converter ({', '.join(CONVERTERS)}). Set "
            "trainer.fast_llm.checkpoint_format to the Fast-LLM converter that reads this model."
        )
    return model_type


def micro_batches_per_step(cfg: RunConfig) -> int:
    """The most micro-batches per rank a step can take to reach docs_per_step: every micro-batch
    holds a whole document at least, and each round adds one per data-parallel rank.

    Fast-LLM's RL branches size their data sampler before training, as train_iters x
    `schedule.depth_first_micro_batches` micro-batches per rank ("ignored when docs_per_step is
    set", says its docs, yet it still sizes the sampler), so with the default 1, a run whose
    steps need more than one micro-batch runs out of samples mid-run and crashes with
    StopIteration in `_prefetch_to_doc_target` (measured: SmolLM2, 8 documents per step in
    128-token micro-batches, in its first step). A step still takes only what reaches the target."""
    return -(-docs_per_step(cfg) // data_parallel(cfg))


def data_parallel(cfg: RunConfig) -> int:
    """Data-parallel ranks reading the stream (the stand-in trainer simulates this many)."""
    f = cfg.trainer.fast_llm
    return f.nproc_per_node if f.data_parallel is None else f.data_parallel


def broadcast_backend(t: TrainerConfig) -> str:
    """The weight broadcast's collective backend: trainer.fast_llm.broadcast_backend, or with `auto`
    the one trainer.device calls for."""
    from rlrun.trainer.parallel import collective_backend

    chosen = t.fast_llm.broadcast_backend
    return collective_backend(t.device) if chosen == "auto" else chosen


def fast_llm_config(
    cfg: RunConfig,
    revision: Revision,
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
    on_cpu = t.device == "cpu"
    converter = checkpoint_format(cfg, model_path)
    distributed: dict[str, Any] = {"compute_dtype": _COMPUTE_DTYPE[cfg.model.dtype]}
    if on_cpu:
        distributed.update(use_cuda=False, backend="gloo")
    generated: dict[str, Any] = {
        "run": {"experiment_dir": str(experiment_dir)},
        "pretrained": {"format": converter, "path": str(model_path), "model_weights": True},
        "model": {
            "base_model": {
                "head": {
                    "losses": {
                        a.name: {
                            "type": a.name,  # grpo: token ratios; gspo: the sequence ratio
                            "epsilon_low": a.clip_eps_low,
                            "epsilon_high": a.clip_eps_high,
                            "logits_scale_factor": 1.0 / cfg.actor.temperature,
                            "metrics": "none",
                        }
                    }
                }
            },
            "distributed": distributed,
        },
        "training": {
            "train_iters": t.max_train_steps,
            # Fast-LLM also saves at the last step and when interrupted (SIGINT/SIGTERM).
            "checkpoint": {"interval": t.checkpoint_every, "keep": t.keep_checkpoints},
            "num_workers": 0,
        },
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
                    "backend": broadcast_backend(cfg.trainer),
                    # the receivers: one rank per vLLM server (Fast-LLM's rank 0 makes it +1)
                    "external_world_size": cfg.inference.num_servers,
                },
                "export": {"format": converter},
            }
        },
    }
    if revision.docs_per_step:
        generated["schedule"] = {
            "docs_per_step": docs_per_step(cfg),
            "depth_first_micro_batches": micro_batches_per_step(cfg),
        }
    if on_cpu:
        generated["data"]["gpu"] = False
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(generated, f.extra)  # mappings merge, the rest replaces
    return cast("dict[str, Any]", OmegaConf.to_container(merged))


def config_text(cfg: RunConfig, revision: Revision, **endpoints: Any) -> str:
    """Fast-LLM's config as the YAML file's text, with a header naming the revision.
    `endpoints`: the keyword arguments of `fast_llm_config`. It holds no secret."""
    data = fast_llm_config(cfg, revision, **endpoints)
    checked = ", ".join(commit.split(" ")[0] for commit in revision.checked_against)
    header = (
        f"# Fast-LLM config generated by rlrun for Fast-LLM revision '{revision.name}' (checked against {checked}).\n"
        "# Change the run's config (trainer.*), not this file: it is rewritten at every start.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False)


def write_config(cfg: RunConfig, revision: Revision, path: Path, **endpoints: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, config_text(cfg, revision, **endpoints))
    return path


def launch_argv(cfg: RunConfig, config_path: Path) -> list[str]:
    """`trainer.fast_llm.command` with {nproc}, {config} and {data_parallel} filled in."""
    f = cfg.trainer.fast_llm
    values = {
        "{nproc}": str(f.nproc_per_node),
        "{config}": str(config_path),
        "{data_parallel}": str(data_parallel(cfg)),
    }
    argv = []
    for arg in f.command:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        argv.append(arg)
    return argv
