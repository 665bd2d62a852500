"""Weight updates into a real vLLM server (CPU) through rlrun's worker extension, both ways:
what the Fast-LLM stand-in broadcasts (the weight follower's calls), and a checkpoint folder (the
hf trainer's call). The model ties its embedding and LM head, as Qwen2.5 does. After each update
the server's log-probabilities match transformers' on the new weights, not on the old ones."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file

from rlrun import launch
from rlrun.backends.fast_llm.follower import VllmBroadcastAdmin
from rlrun.config import compose
from rlrun.inference.server import SERVED_MODEL_NAME, base_url, healthy, server_argv, server_env
from rlrun.streams.server import pick_free_port
from tests.fast_llm_standin import Broadcaster, weights_at

from .test_fast_llm_broadcast import in_thread

pytestmark = pytest.mark.timeout(600)

HOST = "127.0.0.1"
STEP = 20  # far enough from the pretrained weights to change what the model says
PROMPT = "12+7="


def tied_copy(model_path: str, folder) -> str:
    """The tiny model with its LM head tied to its embedding (saved without lm_head.weight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
    model = tied_copy(launch.model_path(cfg, build=True), tmp_path_factory.mktemp("tied"))
    port = pick_free_port(HOST)
    argv = server_argv(cfg.inference, cfg.model, model, port, tokenizer=model)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **server_env(cfg.inference)}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = base_url(HOST, port)
    try:
        deadline = time.time() + 300
        while not healthy(url):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield url, model
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def greedy(url: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt_ids, "max_tokens": 6, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def transformers_logprobs(model_path: str, weights: dict, prompt_ids: list[int], completion: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)  # a tied model's file has no lm_head.weight
    model.tie_weights()
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return [logprobs[len(prompt_ids) - 1 + k, token].item() for k, token in enumerate(completion)]


def test_vllm_serves_the_weights_fast_llm_broadcast(server):
    from transformers import AutoTokenizer

    url, model = server
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    pretrained = load_file(os.path.join(model, "model.safetensors"))
    admin = VllmBroadcastAdmin([url], receive_timeout_s=60)
    port = pick_free_port(HOST)

    admin.join(HOST, port, "gloo", 60)  # answers at once; the worker joins in the background
    sender = Broadcaster(HOST, port, 1, "gloo", timeout=60)  # as Fast-LLM's start: waits for the worker
    receiving = in_thread(lambda: admin.receive("1-0", STEP))
    sender.send(weights_at(pretrained, STEP))
    (report,) = receiving()
    assert report["step"] == STEP and report["tensors"] == len(pretrained)
    assert report["bytes"] == sum(t.numel() * t.element_size() for t in pretrained.values())

    completion, served = greedy(url, prompt)
    moved = transformers_logprobs(model, weights_at(pretrained, STEP), prompt, completion)
    before = transformers_logprobs(model, pretrained, prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, moved)) < 2e-3  # the broadcast weights
    assert max(abs(a - b) for a, b in zip(served, before)) > 0.05  # not the ones it started with

    (again,) = admin.receive("1-0", STEP)  # a retried call for the event loaded last returns at once
    assert again["already_loaded"] is True

    # A restarted trainer goes back to its checkpoint's step and broadcasts it again: loaded again.
    receiving = in_thread(lambda: admin.receive("2-0", 2))
    sender.send(weights_at(pretrained, 2))
    (report,) = receiving()
    assert report["step"] == 2 and report["tensors"] == len(pretrained)
    completion, served = greedy(url, prompt)
    moved = transformers_logprobs(model, weights_at(pretrained, 2), prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, moved)) < 2e-3
    admin.close()



def test_vllm_serves_a_checkpoint_folder_reloaded_by_the_trainers_call(server, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrun.inference.admin import VllmAdmin

    url, model = server
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    moved = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    moved.load_state_dict(weights_at(load_file(os.path.join(model, "model.safetensors")), 30), strict=False)
    moved.tie_weights()
    moved.save_pretrained(tmp_path / "step-30")  # as the trainer saves a step's weights (tied: no lm_head)

    admin = VllmAdmin([url])
    admin.reload_weights(str(tmp_path / "step-30"))
    admin.close()

    completion, served = greedy(url, prompt)
    expected = transformers_logprobs(model, dict(moved.state_dict()), prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, expected)) < 2e-3
