"""The tiny demo model: a ~300k-parameter Qwen2 with a character vocabulary, built locally once.

Owns the model's shape, its character tokenizer, the short supervised warm start and the cache
folder: a plain Hugging Face model folder that transformers loads and vLLM serves, nothing
downloaded. Pure RL from random weights collapses on this task (one answer, vanishing group
advantages), so the build ends with a few supervised steps to roughly 20 % exact answers.
Refuses: serving, the RL trainer's loop, the dataset's order. torch, transformers and tokenizers
are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlrun.models.cache import MARKER, built_once
from rlrun.task.arithmetic import Sum, arithmetic_problems

log = logging.getLogger(__name__)

FORMAT_VERSION = 4  # bump when the architecture, tokenizer or warm start changes: new folder names

HIDDEN = 128
HEADS = 2  # head_dim = HIDDEN / HEADS = 64: vLLM's CPU attention rejects head dims below 64
KV_HEADS = 1
INTERMEDIATE = 256
LAYERS = 2
VOCAB_SIZE = 64

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)
# Specials, digits, operators, space, lower-case letters, then punctuation up to 64 entries.
# No "<" or ">": they would make texts that look like special tokens ambiguous. Stored in
# GPT-2's byte-level form (space is "Ġ"), as Qwen2's tokenizer pipeline expects.
CHARACTERS = (
    tuple(string.digits) + tuple("+-*=") + (" ",) + tuple(string.ascii_lowercase) + tuple(".,:;!?()/%$#&'\"_[]^")
)

WARM_START_LR = 1.5e-3  # AdamW learning rate; with 40 steps: ~15-27 % sampled accuracy (12 seeds)
WARM_START_BATCH = 128  # problems per warm-start step, drawn with replacement
EVAL_MAX_PROBLEMS = 1000  # accuracy recorded in the marker is measured on at most this many


@dataclass(frozen=True)
class TinyBuild:
    """The parameters that determine a tiny model folder; their hash names the folder."""

    seed: int
    warm_start_steps: int
    max_operand: int
    max_model_len: int
    format_version: int = FORMAT_VERSION

    def folder_name(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return f"tiny-v{self.format_version}-{hashlib.sha256(blob).hexdigest()[:12]}"


def ensure_tiny_model(cache_dir: Path, seed: int, warm_start_steps: int, max_operand: int, max_model_len: int) -> Path:
    """The folder of the tiny model for these parameters, built first if needed (once, under a lock,
    into a temporary sibling renamed into place marker and all: a crash never looks finished)."""
    build = TinyBuild(
        seed=seed, warm_start_steps=warm_start_steps, max_operand=max_operand, max_model_len=max_model_len
    )
    return built_once(cache_dir, build.folder_name(), lambda folder: _build(build, folder))


def longest_sequence(max_operand: int) -> int:
    """Tokens in the longest training sequence: prompt "a+b=", answer, end-of-sequence."""
    digits = len(str(max_operand))
    return 2 * digits + 2 + len(str(2 * max_operand)) + 1


def config_problems(max_model_len: int, dataset: str, max_operand: int) -> list[str]:
    """What building the tiny model for this dataset would refuse, one sentence each."""
    if dataset != "arithmetic":
        return []
    longest = longest_sequence(max_operand)
    if max_model_len >= longest:
        return []
    return [
        f"model.max_model_len={max_model_len} is too short for sums up to {max_operand}+{max_operand} "
        f"({longest} tokens): set model.max_model_len={longest} or more, or lower dataset.max_operand."
    ]


# --- the build -----------------------------------------------------------------------------------
def _build(build: TinyBuild, folder: Path) -> None:
    import torch

    started = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's global RNG state is left untouched
            torch.manual_seed(build.seed)
            tokenizer = build_tokenizer(build.max_model_len)
            model = _new_model(build, tokenizer)
            problems = arithmetic_problems(build.max_operand, (build.max_operand + 1) ** 2, build.seed)
            losses = _warm_start(model, tokenizer, problems, build)
            evaluated = problems[:EVAL_MAX_PROBLEMS]
            accuracy = _accuracy(model, tokenizer, evaluated, build.max_operand)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    _portable_tokenizer_config(folder / "tokenizer_config.json")
    record = {
        "format_version": build.format_version,
        "build": asdict(build),
        "architecture": "Qwen2ForCausalLM",
        "parameters": sum(p.numel() for p in model.parameters()),
        "warm_start": {
            "steps": build.warm_start_steps,
            "lr": WARM_START_LR,
            "batch": WARM_START_BATCH,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
        },
        "accuracy": {"problems": len(evaluated), **accuracy},
        "build_seconds": round(time.monotonic() - started, 2),
    }
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")  # last: marks the build done
    log.info("built tiny model %s: %s", folder.name, record["accuracy"])


def build_tokenizer(max_model_len: int):
    """The character tokenizer: one id per character, nothing added on encode, exact decode. A
    Qwen2 byte-level BPE without merges: transformers 5 rebuilds a Qwen2 pipeline from the
    vocabulary, and built this way it is the same one, so transformers, vLLM and the actor agree."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX  # Qwen2's split: both pipelines agree

    to_byte_level = {chr(b): c for b, c in bytes_to_unicode().items() if b < 128}  # GPT-2's: " " is "Ġ"
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(to_byte_level[c] for c in CHARACTERS))}
    if len(vocab) != VOCAB_SIZE:  # a bug in the constants above, not user input
        raise RuntimeError(f"tiny vocabulary has {len(vocab)} entries, expected {VOCAB_SIZE}")
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,  # named, so Qwen2Tokenizer does not add its default "<|endoftext|>"
        clean_up_tokenization_spaces=False,
        model_max_length=max_model_len,
    )


def _portable_tokenizer_config(path: Path) -> None:
    """Name Qwen2's tokenizer class, which is what transformers 5 loads for a qwen2 model anyway."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config.pop("backend", None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def _new_model(build: TinyBuild, tokenizer):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    specials = (("pad", PAD), ("eos", EOS), ("bos", BOS))
    ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(token) for name, token in specials}
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=build.max_model_len,
        # Untied, as built before rlrun's reload handled tied weights (inference/transfer_engine.py); kept
        # so the cached model (and the figures measured on it) stay valid.
        tie_word_embeddings=False,
        use_sliding_window=False,
        dtype="float32",
        **ids,
    )
    # No explicit `head_dim` key: it equals hidden/heads, and Fast-LLM's Qwen2 importer refuses a
    # config.json that has one ("HF config has unknown key 'head_dim'").
    model = Qwen2ForCausalLM(config).float()
    # Token ids only: vLLM takes sampling defaults from generation_config, and the actor sets its own.
    model.generation_config = GenerationConfig(**ids)
    return model


def _batch(tokenizer, problems: list[Sum]):
    """Right-padded prompt+answer+eos ids, attention mask, and labels on the answer and eos only."""
    import torch

    eos = tokenizer.convert_tokens_to_ids(EOS)
    pad = tokenizer.convert_tokens_to_ids(PAD)
    rows, label_rows = [], []
    for problem in problems:
        prompt = tokenizer.encode(problem.prompt)
        answer = tokenizer.encode(problem.answer) + [eos]
        rows.append(prompt + answer)
        label_rows.append([-100] * len(prompt) + answer)
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    labels = torch.tensor([row + [-100] * (width - len(row)) for row in label_rows])
    return input_ids, mask, labels


def _warm_start(model, tokenizer, problems: list[Sum], build: TinyBuild) -> list[float]:
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START_LR, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(build.seed)
    losses = []
    for _ in range(build.warm_start_steps):
        picks = torch.randint(len(problems), (WARM_START_BATCH,), generator=generator).tolist()
        input_ids, mask, labels = _batch(tokenizer, [problems[i] for i in picks])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(round(loss.item(), 4))
    model.eval()
    return losses


def _accuracy(model, tokenizer, problems: list[Sum], max_operand: int) -> dict[str, float]:
    """Exact-answer accuracy: greedy, and the expected rate when sampling at temperature 1 (the
    mean probability of "answer<eos>": no sampling noise; what RL's first groups see on average)."""
    import torch

    eos = tokenizer.convert_tokens_to_ids(EOS)
    with torch.no_grad():
        input_ids, mask, labels = _batch(tokenizer, problems)
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
        targets = labels[:, 1:]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        picked = logprobs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        answer_logprob = (picked * (targets != -100)).sum(-1)
        sampled = answer_logprob.exp().mean().item()

        greedy_hits = 0
        budget = len(str(2 * max_operand)) + 1  # longest answer, then its end-of-sequence
        by_length: dict[int, list[Sum]] = {}
        for problem in problems:
            by_length.setdefault(len(problem.prompt), []).append(problem)
        for width, group in by_length.items():  # same prompt length: decode the group as one batch
            ids = torch.tensor([tokenizer.encode(p.prompt) for p in group])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=False)
            for problem, row in zip(group, out[:, width:].tolist()):
                text = tokenizer.decode(row[: row.index(eos)]) if eos in row else None
                greedy_hits += text == problem.answer
    return {"greedy": round(greedy_hits / len(problems), 4), "sampled_t1": round(sampled, 4)}
