"""Weight updates into a real vLLM server (CPU) through rlrun's worker extension, both ways:
what the Fast-LLM stand-in broadcasts (the weight follower's calls), and a checkpoint folder (the
hf trainer's call). The model ties its embedding and LM head, as Qwen2.5 does. After each update
the server's log-probabilities match transformers' on the new weights, not on the old ones.

The server runs as a run runs it (rlrun's argv, env and API key in VLLM_API_KEY): every route but
/health needs the key, and every client here sends it."""

from __future__ import annotations

import json
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
from rlrun.inference.auth import bearer_header
from rlrun.inference.server import SERVED_MODEL_NAME, base_url, healthy, server_argv, server_env
from rlrun.streams.server import pick_free_port
from tests.fast_llm_standin import Broadcaster, weights_at

from .test_fast_llm_broadcast import in_thread

pytestmark = pytest.mark.timeout(600)

HOST = "127.0.0.1"
STEP = 20  # far enough from the pretrained weights to change what the model says
PROMPT = "12+7="
KEY = "the-runs-vllm-key-for-this-test-0123"


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
        proc = subprocess.Popen(argv, env={**os.environ, **server_env(cfg.inference), "VLLM_API_KEY": KEY}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = base_url(HOST, port)
    try:
        deadline = time.time() + 300
        while not healthy(url):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield url, model, log
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def greedy(url: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt_ids, "max_tokens": 6, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, headers=bearer_header(KEY), timeout=60).json()["choices"][0]
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

    url, model, _ = server
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    pretrained = load_file(os.path.join(model, "model.safetensors"))
    admin = VllmBroadcastAdmin([url], receive_timeout_s=60, api_key=KEY)
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

    url, model, _ = server
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    moved = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    moved.load_state_dict(weights_at(load_file(os.path.join(model, "model.safetensors")), 30), strict=False)
    moved.tie_weights()
    moved.save_pretrained(tmp_path / "step-30")  # as the trainer saves a step's weights (tied: no lm_head)

    admin = VllmAdmin([url], api_key=KEY)
    admin.reload_weights(str(tmp_path / "step-30"))
    admin.close()

    completion, served = greedy(url, prompt)
    expected = transformers_logprobs(model, dict(moved.state_dict()), prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, expected)) < 2e-3


# Every route a local process could use to steer the run: (method, path, body). Each must answer
# 401 without the key and do its job with it.
ADMIN_ROUTES = [
    ("POST", "/pause?mode=abort", None),
    ("GET", "/is_paused", None),
    ("POST", "/resume", None),
    ("POST", "/reset_prefix_cache", None),
    ("POST", "/abort_requests", {"request_ids": ["none-such"]}),
    ("POST", "/collective_rpc", {"method": "rlrun_reload_weights", "kwargs": {"weights_path": "{model}"}}),
    ("GET", "/is_sleeping", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": SERVED_MODEL_NAME, "prompt": [1, 2], "max_tokens": 1}),
]


def test_every_admin_route_needs_the_runs_key(server):
    """A local process without the key can neither freeze generation nor swap the policy; the key
    opens every route; /health stays open for the probe; the key is in no log."""
    url, model, log = server
    with httpx.Client(base_url=url, timeout=120) as anyone, httpx.Client(base_url=url, timeout=120, headers=bearer_header(KEY)) as run:
        paused = False  # what the server should say: only the key's /pause and /resume change it
        for method, path, body in ADMIN_ROUTES:
            body = None if body is None else json.loads(json.dumps(body).replace("{model}", model))
            for who, headers in (("nobody", {}), ("a wrong key", bearer_header("guess")), ("a non-bearer", {"Authorization": KEY})):
                refused = anyone.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, f"{method} {path} with {who}: {refused.status_code} {refused.text[:200]}"
            assert run.get("/is_paused").json() == {"is_paused": paused}, f"{path} without the key changed the pause state"
            allowed = run.request(method, path, json=body)
            assert allowed.status_code == 200, f"{method} {path} with the key: {allowed.status_code} {allowed.text[:300]}"
            paused = {"/pause?mode=abort": True, "/resume": False}.get(path, paused)
            assert run.get("/is_paused").json() == {"is_paused": paused}  # the key's pause/resume took effect
        assert run.get("/is_paused").json() == {"is_paused": False}
        assert anyone.get("/health").status_code == 200
        # The reload went through: the served model is the one on disk again, and it generates.
        assert len(greedy(url, [1, 2, 3])[0]) >= 1
    assert KEY not in log.read_text(errors="replace")
