"""Settings the chosen options make meaningless: an error, never silently ignored (`model.path=...`
with `model.source=tiny` would train the tiny model). Only the command line's overrides are checked:
the shipped config groups carry every key.

    problems = ignored_overrides(cfg, overrides)   # pure: [] or one sentence per ignored key
"""

from __future__ import annotations

from typing import Callable, Optional

from rlrun.config.schema import RunConfig

# (key or section, when it is ignored, what to do instead)
Rule = tuple[str, Callable[[RunConfig], bool], str]

RULES: list[Rule] = [
    (
        "model.path",
        lambda c: c.model.source == "tiny",
        "the tiny model is built locally, so a path would be ignored: set model.source=path (a local folder) or "
        "model.source=hub (a hub id) to train that model, or remove model.path",
    ),
    (
        "model.warm_start_steps",
        lambda c: c.model.source != "tiny",
        "only the tiny model is warm-started (model.source=tiny): remove it",
    ),
    (
        "model.cache_dir",
        lambda c: c.model.source not in ("tiny", "gguf"),
        "only the tiny model and GGUF models are built into it (model.source=tiny or gguf): remove it",
    ),
    (
        "dataset.max_operand",
        lambda c: c.dataset.name not in ("arithmetic", "guess"),
        "it shapes dataset=arithmetic and dataset=guess only: remove it or choose one of them",
    ),
    (
        "dataset.num_problems",
        lambda c: c.dataset.name not in ("arithmetic", "reasoning_gym", "guess"),
        "it sizes the generated datasets only (arithmetic, reasoning_gym, guess): remove it",
    ),
    *[
        (
            f"dataset.{key}",
            lambda c: c.dataset.name != "reasoning_gym",
            "it configures dataset=reasoning_gym only: remove it or set dataset=reasoning_gym",
        )
        for key in ("task", "task_args", "answer_format")
    ],
    *[
        (
            f"dataset.{key}",
            lambda c: c.dataset.name != "gsm8k",
            "it says where dataset=gsm8k is loaded from; the other datasets are generated: remove it or choose dataset=gsm8k",
        )
        for key in ("hf_path", "hf_config")
    ],
    (
        "dataset.split",
        lambda c: c.dataset.name not in ("gsm8k", "files"),
        "it picks the split of dataset=gsm8k or of dataset=files' `datasets` folders: remove it",
    ),
    *[
        (
            f"dataset.{key}",
            lambda c: c.dataset.name != "files",
            "it names dataset=files' own files: set dataset=files, or remove it",
        )
        for key in ("train_files", "eval_files", "eval_split")
    ],
    (
        "trainer.fast_llm",
        lambda c: c.trainer.backend != "fast_llm",
        "it configures the Fast-LLM trainer only: set trainer=fast_llm, or remove it",
    ),
    (
        "trainer.nproc_per_node",
        lambda c: c.trainer.backend != "hf",
        "it sets the ranks of rlrun's own trainer (trainer=hf): set trainer.fast_llm.nproc_per_node for Fast-LLM",
    ),
    *[
        (f"trainer.{key}", lambda c: c.trainer.backend != "hf", "rlrun's own trainer only (trainer=hf): remove it")
        for key in (
            "sharding",
            "mixed_precision",
            "activation_checkpointing",
            "weight_transfer",
            "overlap_weight_update",
        )
    ],
    (
        "trainer.weight_sync_timeout_s",
        lambda c: c.trainer.backend != "hf" or c.trainer.weight_transfer != "broadcast",
        "it bounds the hf trainer's weight broadcast only: set trainer.weight_transfer=broadcast, or remove it",
    ),
    (
        "supervisor.weights",
        lambda c: c.trainer.backend != "fast_llm",
        "the weight follower runs with trainer=fast_llm only: set trainer=fast_llm, or remove it",
    ),
    (
        "world.cpu_affinity",
        lambda c: c.world.kind != "local",
        "Ray or SLURM places the processes: remove it, or set world=local",
    ),
    ("world.address", lambda c: c.world.kind != "ray", "it names a Ray cluster: set world=ray, or remove it"),
    (
        "world.placement_timeout_s",
        lambda c: c.world.kind == "local",
        "Ray or SLURM placement only: set world=ray or world=slurm, or remove it",
    ),
    *[
        (
            f"world.{role}.resources",
            lambda c: c.world.kind != "ray",
            "custom Ray resources pick Ray nodes: set world=ray, or remove it (world=slurm places a role by world.<role>.gpus and .cpus)",
        )
        for role in ("redis", "vllm", "trainer", "actor")
    ],
    *[
        (
            f"world.{role}",
            lambda c: c.world.kind == "local",
            "Ray or SLURM placement only: set world=ray or world=slurm, or remove it",
        )
        for role in ("redis", "vllm", "trainer", "actor")
    ],
    *[
        (f"world.{key}", lambda c: c.world.kind != "slurm", "a SLURM job's setting: set world=slurm, or remove it")
        for key in (
            "nodes",
            "gpus_per_node",
            "cpus_per_node",
            "time",
            "partition",
            "account",
            "sbatch_lines",
            "srun_args",
            "signal_lead_s",
            "requeue",
            "max_starts_without_progress",
        )
    ],
    *[
        (
            f"streams.{key}",
            lambda c: c.streams.url is not None,
            "with streams.url rlrun uses that Redis and starts none: remove it, or unset streams.url",
        )
        for key in ("server", "host", "appendfsync")
    ],
    (
        "actor.journal_flush_tokens",
        lambda c: not c.actor.journal,
        "nothing is journaled with actor.journal=false: remove it, or set actor.journal=true",
    ),
]


def rule_for(key: str) -> Optional[Rule]:
    """The rule about dotted `key` or a section above it (the first: a key's own rule comes before its section's)."""
    return next((rule for rule in RULES if key == rule[0] or key.startswith(rule[0] + ".")), None)


def ignored_overrides(cfg: RunConfig, overrides: list[str]) -> list[str]:
    """One sentence per override that `cfg`'s choices make meaningless, naming what to do instead."""
    problems = []
    for item in overrides:
        if item.startswith("~") or "=" not in item:  # a deletion sets nothing
            continue
        key = item.split("=", 1)[0].lstrip("+")
        rule = rule_for(key)
        if rule is not None and rule[1](cfg):
            problems.append(f"{key} has no effect here: {rule[2]}.")
    return problems
