"""A stand-in for Fast-LLM's trainer (`fast-llm train gpt --config <file>`) that needs no GPU.

    python tests/fast_llm_standin.py --config <fast-llm.yaml> [--revision main|pr520|pr502] [-v]
                                     [--data-parallel N] [--step-delay S]

It reads the Fast-LLM YAML rlrun generates and behaves like Fast-LLM where rlrun can see it
(ServiceNow/Fast-LLM: fast_llm/data/dataset/streaming.py, fast_llm/engine/training/trainer.py and
streaming.py, fast_llm/core/distributed.py). It learns nothing: a step consumes documents, and
its "weights" after step s are the pretrained ones moved s times along a fixed seeded direction
(`weights_at`), so a test can tell which step's weights a vLLM server serves.

- Redis: connects with host and port only (no password), creates consumer group `fast_llm_group`
  on `fast_llm_streaming` from id 0 with MKSTREAM (BUSYGROUP ignored), reads with XREADGROUP
  COUNT 1 BLOCK 1000 NOACK as consumer `fast_llm_consumer_<rank>`, and parses each message like
  Fast-LLM (`data` JSON merged with the other fields; old log-probs one per token).
- Steps: each of the `--data-parallel` simulated ranks packs whole documents into micro-batches
  of `data.micro_batch_size` tokens (a document that does not fit waits for the next one); a step
  takes micro-batches from all ranks until the global document count reaches
  `schedule.docs_per_step`, so it overshoots like `Trainer._prefetch_to_doc_target`. Its data
  sampler holds `train_iters` x `schedule.depth_first_micro_batches` micro-batches per rank, as
  the real one's (sized before training, docs_per_step or not): a run that needs more dies with
  StopIteration.
- Events on `fast_llm_events`, field `event`: `weights_ready` (step, documents_seen) when the run
  begins and after every step; `training_finished` when the loop ends, also after SIGTERM/SIGINT
  (the step in progress is finished first, then a checkpoint is saved), then exit 0.
- Weight broadcast, as `StreamingTrainerCallback`: at start, rank 0 of a group of
  `broadcast.external_world_size + 1` ranks: `torch.distributed.rendezvous("tcp://host:port")`
  (its TCP store's server), then a gloo/NCCL group on that store under the prefix
  `range_0_<n>_1/`; it waits there until every receiver has joined. After each `weights_ready`:
  per tensor of the HF-format model, `broadcast_object(("weights", name, shape, dtype))` then the
  tensor, then `broadcast_object(None)`; `broadcast_object` sends the pickle's byte count as a
  one-element int64 tensor, then its bytes as uint8.
- Starved for `timeout` seconds: `TimeoutError("No document received after N seconds")`, exit 1.
- Checkpoints: `<experiment_dir>/checkpoint/<step>/` created with exist_ok=False, `metadata.yaml`
  (completed_steps, documents_seen), `ok` written last; every `training.checkpoint.interval` steps,
  at the last step and when interrupted; all but the newest `keep` complete ones are deleted.
- Resume: lists `checkpoint/` with `int(name)` (a non-numeric entry crashes it), takes the highest
  step and asserts its `ok` exists (a half-written highest checkpoint makes it fail), exactly as
  Fast-LLM does: rlrun must move such a directory aside first.

Per revision (`--revision`, the real commits of rlrun/backends/fast_llm/revisions.py):
- `pr520` (d3d20226, the default) and `pr502` (227f8bc1) know `schedule.docs_per_step`; `main`
  (7d61a1ba) does not: a step there is one micro-batch per rank (`schedule.depth_first_micro_batches`).
- `pr502` sends no `documents_seen` with `weights_ready` and records none in its checkpoints.
- On `main` the GRPO/GSPO loss's `metrics` default (`auto`) needs a per-document `reward`: a
  document without one crashes the first step, as the real one does.
Like the real one on every revision: the config is read strictly (an unknown key is refused with
Fast-LLM's "Unknown field" message, at start and with `-v`, which validates and stops); a
pretrained `config.json` with a `head_dim` key is refused (its Qwen2 importer does); the streaming
dataset crashes the first batch unless `training.num_workers` is 0 or 1; without CUDA it refuses
to start unless `model.distributed.use_cuda` is false; checkpoint metadata nests the trainer's
counts under `metadata:`.

Test hooks (not Fast-LLM's): `broadcast.port: 0` means no receivers (no group, no broadcast);
`--step-delay` sleeps after each step; `--crash-in-checkpoint K`
writes checkpoint K without `ok` and dies (as if killed during the save), once per experiment
directory; `--trained-log FILE` appends one JSON line per step with the stream ids it trained;
`--hold-after-step K` waits at the end of step K (after its `weights_ready` and trained-log line)
until SIGTERM/SIGINT: the interrupt is seen at step K however late a test sends it.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import logging
import os
import pathlib
import pickle
import shutil
import signal
import sys
import time
import zlib

import redis
import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file

STREAM = "fast_llm_streaming"  # fast_llm/data/dataset/config.py REDIS_DATA_STREAM
GROUP = "fast_llm_group"  # REDIS_GROUP_NAME
DATA_FIELD = b"data"
EVENTS = "fast_llm_events"  # fast_llm/engine/training/streaming.py REDIS_TRAINING_STREAM
EVENT_FIELD = "event"  # REDIS_TRAINING_FIELD

log = logging.getLogger("fast_llm_standin")

REVISIONS = ("main", "pr520", "pr502")
LOSS_KEYS = {"type": None, "weight": None, "epsilon_low": None, "epsilon_high": None, "logits_scale_factor": None,
             "metrics": None}  # fmt: skip
# The keys the stand-in knows (a subset of the real schema: what rlrun writes, and a few more).
# None: a leaf. A key not listed is refused as Fast-LLM refuses it.
SCHEMA = {
    "run": {"experiment_dir": None},
    "pretrained": {"format": None, "path": None, "model_weights": None},
    "model": {"base_model": {"head": {"losses": "losses"}},
              "distributed": {"compute_dtype": None, "use_cuda": None, "backend": None}},
    "training": {"train_iters": None, "num_workers": None, "checkpoint": {"interval": None, "keep": None},
                 "logs": {"interval": None}},
    "schedule": {"depth_first_micro_batches": None},
    "data": {"micro_batch_size": None, "maximum_document_length": None, "truncate_documents": None, "gpu": None,
             "datasets": {"training": {"type": None, "host": None, "port": None, "timeout": None}}},
    "optimizer": {"learning_rate": {"base": None}, "beta_1": None, "beta_2": None, "weight_decay": None,
                  "gradient_norm_clipping": None},
    "callbacks": {"streaming": {"type": None, "host": None, "port": None, "timeout": None,
                                "broadcast": {"host": None, "port": None, "backend": None, "external_world_size": None},
                                "export": {"format": None}}},
}  # fmt: skip


def unknown_keys(config: dict, revision: str) -> list[str]:
    """Fast-LLM's validation lines for `config` on `revision`, nested as its fast_llm/config.py
    nests them: one `Validation failed for field` line per level, two spaces deeper each, down to
    its `Unknown field` lines."""
    schema = json.loads(json.dumps(SCHEMA))
    if revision != "main":
        schema["schedule"]["docs_per_step"] = None

    def walk(value, allowed, cls: str, indent: str) -> list[str]:
        if allowed == "losses":
            found = []
            for name, loss in (value or {}).items():
                if not isinstance(loss, dict):
                    continue
                inner = walk(loss, LOSS_KEYS, "LanguageModelLossConfig", indent + "  ")
                if loss.get("type") not in ("grpo", "gspo", "label"):
                    inner.append(f"{indent}  Unknown type `{loss.get('type')}` in class LanguageModelLossConfig")
                if inner:
                    found += [f"{indent}Validation failed for field `losses[{name}]`:", *inner]
            return found
        if not isinstance(value, dict) or allowed is None:
            return []
        found = []
        for key, sub in value.items():
            if key not in allowed:
                found.append(f"{indent}Unknown field `!!! {key}` in class {cls}")
                continue
            kind = "losses" if allowed[key] == "losses" else key.title().replace("_", "") + "Config"
            inner = walk(sub, allowed[key], kind, indent + "  ")
            if inner:
                found += [f"{indent}Validation failed for field `{key}` of type `{kind}` in class {cls}:", *inner]
        return found

    return walk(config, schema, "fast_llm.models.gpt.config.GPTTrainerConfig", "")


def refusal(config: dict, revision: str) -> str | None:
    """Why the real Fast-LLM of `revision` would refuse to start on `config` (None: it starts)."""
    unknown = unknown_keys(config, revision)
    if unknown:
        return "fast_llm.config.NestedValidationError: " + "\n".join(unknown)
    hf_config = pathlib.Path(config["pretrained"]["path"]) / "config.json"
    if hf_config.is_file() and "head_dim" in json.loads(hf_config.read_text()):
        return "ValueError: Qwen2BaseModelConverter: HF config has unknown key 'head_dim'"
    use_cuda = config.get("model", {}).get("distributed", {}).get("use_cuda", True)
    if use_cuda and not torch.cuda.is_available():
        return "AssertionError: CUDA is not available (set model.distributed.use_cuda: false to run on the CPU)"
    return None


class Interrupter:
    """SIGINT/SIGTERM set a flag checked at the end of each step; a second signal is not caught."""

    def __init__(self) -> None:
        self.interrupted = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        log.info("Interrupt signal %s received.", signal.Signals(signum).name)
        if self.interrupted:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.interrupted = True


STEP_SIZE = 0.05  # how far (in units of each tensor's std) the weights move per step


def weights_at(pretrained: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """The stand-in's weights after `step` steps: each tensor moved `step` times along its own
    seeded random direction (seeded by its name, so a test can compute them too)."""
    moved = {}
    for name, tensor in pretrained.items():
        direction = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
        scale = tensor.float().std() if tensor.numel() > 1 else torch.tensor(0.0)
        moved[name] = (tensor.float() + STEP_SIZE * step * scale * direction).to(tensor.dtype)
    return moved


class Broadcaster:
    """Rank 0 of Fast-LLM's weight broadcast group (see the module docstring)."""

    def __init__(self, host: str, port: int, external_world_size: int, backend: str, timeout: float) -> None:
        if backend != "gloo":
            raise ValueError("the stand-in broadcasts over gloo only (it runs without a GPU)")
        world_size = external_world_size + 1
        delta = datetime.timedelta(seconds=timeout)
        log.info("Waiting for weights broadcast rendezvous at tcp://%s:%d ...", host, port)
        self.store, _, _ = next(dist.rendezvous(f"tcp://{host}:{port}", 0, world_size, timeout=delta))
        prefixed = dist.PrefixStore(f"range_0_{world_size}_1/", self.store)
        self.group = dist.ProcessGroupGloo(prefixed, 0, world_size, delta)
        log.info("Weights broadcast rendezvous at tcp://%s:%d connected", host, port)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_object(self, value) -> None:
        buffer = io.BytesIO()
        pickle.Pickler(buffer).dump(value)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64))
        self._broadcast(payload.clone())

    def send(self, weights: dict[str, torch.Tensor]) -> None:
        for name, tensor in weights.items():
            self._broadcast_object(("weights", name, tensor.shape, tensor.dtype))
            self._broadcast(tensor.contiguous())
        self._broadcast_object(None)


class Rank:
    """One simulated data-parallel rank: its consumer and the document left over for its next
    micro-batch."""

    def __init__(self, client: redis.Redis, rank: int, timeout: float) -> None:
        self.client, self.rank, self.timeout = client, rank, timeout
        self.pending: dict | None = None

    def next_document(self) -> dict:
        if self.pending is not None:
            document, self.pending = self.pending, None
            return document
        # Fast-LLM restarts its clock each time the loader asks for the next document.
        start = time.time()
        while True:
            messages = self.client.xreadgroup(
                groupname=GROUP,
                consumername=f"fast_llm_consumer_{self.rank}",
                streams={STREAM: ">"},
                count=1,
                block=1000,
                noack=True,
            )
            if messages:
                for stream_key, entries in messages:
                    assert stream_key == STREAM.encode()
                    for message_id, message in entries:
                        return parse_document(message, message_id.decode())
            elif (t := time.time() - start) > self.timeout:
                raise TimeoutError(f"No document received after {t} seconds")

    def micro_batch(self, token_budget: int) -> list[dict]:
        """Whole documents up to `token_budget` tokens (at least one)."""
        documents, used = [], 0
        while used < token_budget:
            document = self.next_document()
            size = len(document["tokens"])
            if documents and used + size > token_budget:
                self.pending = document
                break
            documents.append(document)
            used += size
        return documents


def parse_document(message: dict, message_id: str = "") -> dict:
    """Like Fast-LLM's `RedisStreamingDocumentData.from_message` + `_validate`."""
    fields: dict = {}
    for key, value in message.items():
        if key == DATA_FIELD:
            fields.update(json.loads(value))
        else:
            fields[key.decode()] = value
    tokens = fields["tokens"]
    if isinstance(tokens, bytes):
        tokens = list(memoryview(tokens).cast("q"))
    old = fields.get("old_log_probabilities")
    if isinstance(old, bytes):
        old = list(memoryview(old).cast("f"))
    if old is not None and len(old) != len(tokens):
        raise AssertionError(f"{len(old)} old log-probabilities for {len(tokens)} tokens")
    for begin, end in fields.get("loss_masking_spans") or []:
        if not 0 <= begin <= end <= len(tokens):
            raise AssertionError(f"loss masking span {[begin, end]} outside a {len(tokens)}-token document")
    return {**fields, "tokens": tokens, "old_log_probabilities": old, "id": message_id}


class Trainer:
    def __init__(self, config: dict, revision: str, data_parallel: int, step_delay: float,
                 crash_in_checkpoint: int | None, trained_log: pathlib.Path | None, hold_after_step: int | None = None):  # fmt: skip
        self.revision = revision
        dataset = config["data"]["datasets"]["training"]
        if dataset.get("type") != "streaming":
            raise ValueError("the stand-in only reads a `streaming` training dataset")
        callback = config["callbacks"]["streaming"]
        self.train_iters = int(config["training"]["train_iters"])
        checkpoint = config["training"].get("checkpoint", {})
        self.interval = checkpoint.get("interval")
        self.keep = checkpoint.get("keep", 5)
        schedule = config.get("schedule", {})
        # main has no docs_per_step: a step is `depth_first_micro_batches` micro-batches per rank
        self.docs_per_step = int(schedule["docs_per_step"]) if "docs_per_step" in schedule else None
        self.micro_batches = int(schedule.get("depth_first_micro_batches", 1))
        self.rounds_left = self.train_iters * self.micro_batches  # the data sampler's (run() sets it after a resume)
        self.num_workers = int(config["training"].get("num_workers", 2))
        losses = config.get("model", {}).get("base_model", {}).get("head", {}).get("losses", {})
        # main's policy-loss metrics default to `auto`, which reads every document's reward
        self.needs_reward = revision == "main" and any(
            loss.get("type") in ("grpo", "gspo") and loss.get("metrics", "auto") != "none" for loss in losses.values()
        )
        self.trained_log = trained_log
        self.micro_batch_size = int(config["data"]["micro_batch_size"])
        self.experiment_dir = pathlib.Path(config["run"]["experiment_dir"])
        self.timeout = float(dataset.get("timeout", 600.0))
        self.step_delay = step_delay
        self.crash_in_checkpoint = crash_in_checkpoint
        self.hold_after_step = hold_after_step
        # Fast-LLM: redis.Redis(host, port) — no password, no username.
        self.data_client = redis.Redis(host=dataset["host"], port=int(dataset["port"]))
        self.events_client = redis.Redis(host=callback["host"], port=int(callback["port"]))
        self.ranks = [Rank(self.data_client, rank, self.timeout) for rank in range(data_parallel)]
        self.completed_steps = 0
        self.documents_seen = 0
        self.broadcast_config = callback["broadcast"]
        self.pretrained_path = pathlib.Path(config["pretrained"]["path"])
        self.broadcaster: Broadcaster | None = None
        self.pretrained: dict[str, torch.Tensor] = {}

    # --- checkpoints, as fast_llm/engine/training/trainer.py --------------------------------
    @property
    def checkpoint_root(self) -> pathlib.Path:
        old, new = self.experiment_dir / "checkpoints", self.experiment_dir / "checkpoint"
        return old if old.is_dir() and not new.is_dir() else new

    def load_last_checkpoint(self) -> None:
        root = self.checkpoint_root
        steps = [int(path.name) for path in root.iterdir()] if root.is_dir() else []
        if not steps:
            log.info("Initializing training state from pretrained checkpoint...")
            return
        last = max(steps)
        directory = root / str(last)
        log.info("Loading checkpoint from iteration %d...", last)
        if not (directory / "ok").is_file():
            raise AssertionError(f"checkpoint {directory} has no 'ok' file")
        metadata = yaml.safe_load((directory / "metadata.yaml").read_text())["metadata"]
        self.completed_steps = int(metadata["completed_steps"])
        self.documents_seen = int(metadata.get("documents_seen") or 0)
        assert self.completed_steps == last

    def save_checkpoint(self) -> None:
        directory = self.checkpoint_root / str(self.completed_steps)
        log.info("Saving checkpoint at iteration %d", self.completed_steps)
        directory.mkdir(exist_ok=False, parents=True)
        counts = {"completed_steps": self.completed_steps}
        if self.revision != "pr502":
            counts["documents_seen"] = self.documents_seen
        metadata = {"fast_llm_version": "standin", "metadata": counts}  # the trainer's counts are nested
        (directory / "metadata.yaml").write_text(yaml.safe_dump(metadata))
        (directory / "state.json").write_text(json.dumps(metadata))  # stands in for the weights
        once = self.checkpoint_root.parent / f".standin-crashed-in-{self.completed_steps}"
        if self.crash_in_checkpoint == self.completed_steps and not once.exists():
            once.touch()  # a crash, not a crash loop: the restarted stand-in gets past this step
            log.error("test hook: dying while writing checkpoint %d", self.completed_steps)
            sys.stdout.flush()
            os._exit(137)
        (directory / "ok").open("w").close()
        log.info("Saved checkpoint to %s", directory)
        if self.keep:
            complete = sorted(int(p.name) for p in self.checkpoint_root.iterdir() if (p / "ok").is_file())
            for step in complete[: -self.keep]:
                shutil.rmtree(self.checkpoint_root / str(step), ignore_errors=True)

    # --- events, as fast_llm/engine/training/streaming.py -----------------------------------
    def send(self, event: dict) -> None:
        self.events_client.xadd(EVENTS, {EVENT_FIELD: json.dumps(event)})

    def broadcast_weights(self, step: int) -> None:
        event = {"type": "weights_ready", "step": step}
        if self.revision != "pr502":  # PR #502's head does not send it
            event["documents_seen"] = self.documents_seen
        self.send(event)
        if self.broadcaster is not None:
            self.broadcaster.send(weights_at(self.pretrained, step))

    def open_broadcast(self) -> None:
        """As the streaming callback's constructor: rendezvous with every receiver (blocks)."""
        b = self.broadcast_config
        if not int(b["port"]):
            log.info("broadcast.port is 0: no receivers, no broadcast (test hook)")
            return
        self.pretrained = load_file(str(self.pretrained_path / "model.safetensors"))
        self.broadcaster = Broadcaster(b["host"], int(b["port"]), int(b["external_world_size"]), b["backend"], self.timeout)

    # --- the loop, as Trainer._train ---------------------------------------------------------
    def step(self) -> list[dict]:
        """One optimizer step's documents: whole micro-batches from every rank until docs_per_step
        is reached (the RL branches), or `micro_batches` per rank (main)."""
        if self.num_workers > 1:
            raise RuntimeError("StreamingDataset can work only with one instance per rank")
        taken: list[dict] = []
        rounds = 0
        while (len(taken) < self.docs_per_step) if self.docs_per_step is not None else (rounds < self.micro_batches):
            if self.rounds_left == 0:  # the sampler is spent: `next(data_iterator)` raises in the real one
                raise StopIteration(f"the data sampler's {self.train_iters} x {self.micro_batches} micro-batches per rank are spent")
            self.rounds_left -= 1
            for rank in self.ranks:
                taken += rank.micro_batch(self.micro_batch_size)
            rounds += 1
        if self.needs_reward and any(document.get("reward") is None for document in taken):
            raise AttributeError("'NoneType' object has no attribute 'float'")  # main's loss metrics read the reward
        return taken

    def run(self) -> None:
        self.data_client.ping()
        try:
            self.data_client.xgroup_create(name=STREAM, groupname=GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.open_broadcast()
        self.load_last_checkpoint()
        if self.completed_steps >= self.train_iters:
            log.info("Training already completed, nothing to do ...")
            return
        # Sized before training as Trainer._setup does: train_iters x depth_first_micro_batches
        # micro-batches per rank, from the completed steps on, even when docs_per_step decides a step
        self.rounds_left = (self.train_iters - self.completed_steps) * self.micro_batches
        with Interrupter() as interrupter:
            self.broadcast_weights(self.completed_steps)  # run_begin
            stop = False
            while not stop:
                documents = self.step()
                self.completed_steps += 1
                self.documents_seen += len(documents)
                log.info("step %d: %d documents (target %s), %d seen", self.completed_steps, len(documents),
                         self.docs_per_step, self.documents_seen)
                if self.trained_log is not None:
                    with self.trained_log.open("a") as out:
                        out.write(json.dumps({"step": self.completed_steps, "ids": [d["id"] for d in documents]}) + "\n")
                self.broadcast_weights(self.completed_steps)  # step_end
                if self.step_delay:
                    time.sleep(self.step_delay)
                if self.hold_after_step == self.completed_steps:
                    log.info("test hook: holding after step %d until interrupted", self.completed_steps)
                    while not interrupter.interrupted:
                        time.sleep(0.05)
                done = self.completed_steps >= self.train_iters
                stop = done or interrupter.interrupted
                if self.interval and (stop or self.completed_steps % self.interval == 0):
                    self.save_checkpoint()
        self.send({"type": "training_finished"})  # train_end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=pathlib.Path)
    parser.add_argument("--data-parallel", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--crash-in-checkpoint", type=int, default=None)
    parser.add_argument("--trained-log", type=pathlib.Path, default=None)
    parser.add_argument("--hold-after-step", type=int, default=None)
    parser.add_argument("--revision", choices=REVISIONS, default="pr520")
    parser.add_argument("-v", "--validate", action="store_true", help="validate the config and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    config = yaml.safe_load(args.config.read_text())
    why = refusal(config, args.revision)
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    if args.validate:
        return 0
    Trainer(config, args.revision, args.data_parallel, args.step_delay, args.crash_in_checkpoint, args.trained_log, args.hold_after_step).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
