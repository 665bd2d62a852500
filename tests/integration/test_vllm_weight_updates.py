"""Weight updates into a real vLLM server (CPU) through rlrun's worker extension, every way:
what the Fast-LLM stand-in broadcasts (the weight follower's calls), a checkpoint folder (the hf
trainer's call with trainer.weight_transfer=disk), and the hf trainer's own broadcast
(=broadcast; last, since it kills and restarts the server to show a restarted one is brought to
the newest weights). The model ties its embedding and LM head, as Qwen2.5 does. After each update
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

from rlrun.backends.fast_llm.follower import VllmBroadcastAdmin
from rlrun.config import compose
from rlrun.inference.auth import bearer_header
from rlrun.inference.server import SERVED_MODEL_NAME, HealthCheck, base_url, server_argv, server_env
from rlrun.models.source import model_path
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


class VllmProcess:
    """One vLLM server as a run starts it, which a test may kill and start again on its port."""

    def __init__(self, model: str, folder) -> None:
        cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
        self.model, self.port = model, pick_free_port(HOST)
        self.argv = server_argv(cfg.inference, cfg.model, model, self.port, tokenizer=model)
        self.env = {**os.environ, **server_env(cfg.inference), "VLLM_API_KEY": KEY}
        self.url, self.log, self.starts = base_url(HOST, self.port), folder / "vllm.log", 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while not HealthCheck(self.url)():
            assert self.proc.poll() is None and time.time() < deadline, self.log.read_text()[-3000:]
            time.sleep(1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
    model = tied_copy(model_path(cfg, build=True), tmp_path_factory.mktemp("tied"))
    vllm = VllmProcess(model, tmp_path_factory.mktemp("vllm"))
    try:
        vllm.start()
        yield vllm
    finally:
        vllm.kill()


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

    url, model = server.url, server.model
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

    url, model = server.url, server.model
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    moved = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    moved.load_state_dict(weights_at(load_file(os.path.join(model, "model.safetensors")), 30), strict=False)
    moved.tie_weights()
    moved.save_pretrained(tmp_path / "step-30")  # as the trainer saves a step's weights (tied: no lm_head)

    admin = VllmAdmin([url], api_key=KEY)
    assert admin.update_weights(str(tmp_path / "step-30"), publish=lambda: None) == []  # the trainer's path
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
    url, model, log = server.url, server.model, server.log
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


def test_the_hf_trainers_broadcast_is_served_and_a_restarted_server_gets_the_newest_weights(server):
    """trainer.weight_transfer=broadcast, rank 0's side (`BroadcastSync`, what the trainer calls
    every step) against the real server: each update is served; a server killed and started again
    comes back with the weights it was started from, and the next update forms a new group with
    it and brings it to the newest. Last in this module: it restarts the server."""
    from transformers import AutoTokenizer

    from rlrun.inference.admin import VllmAdmin
    from rlrun.trainer.weight_broadcast import BroadcastSync

    url, model = server.url, server.model
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    pretrained = load_file(os.path.join(model, "model.safetensors"))
    admin = VllmAdmin([url], api_key=KEY)
    sync = BroadcastSync(admin, HOST, pick_free_port(HOST), "gloo", timeout_s=60)
    published: list[int] = []

    def serves(weights) -> float:
        completion, served = greedy(url, prompt)
        expected = transformers_logprobs(model, weights, prompt, completion)
        return max(abs(a - b) for a, b in zip(served, expected))

    try:
        assert admin.resume_answering() == []  # what a new trainer does first: harmless on a server not paused
        for version, step in ((1, STEP), (2, 2)):
            assert sync.update(weights_at(pretrained, step), version, lambda: published.append(version)) == []
            assert serves(weights_at(pretrained, step)) < 2e-3, f"v{version}"
            if version == 1:
                first = sync.membership
        assert sync.membership == first  # the second update reused the group

        server.kill()  # the supervisor would restart it; meanwhile no server answers: the trainer retries
        with pytest.raises(httpx.ConnectError, match="no vLLM server answers"):
            sync.update(weights_at(pretrained, 3), 3, lambda: published.append(3))
        server.start()  # from the model folder it was started with: stale weights
        assert serves(pretrained) < 2e-3

        assert sync.update(weights_at(pretrained, 3), 3, lambda: published.append(3)) == []
        assert sync.membership.group_id != first.group_id  # a new group, with the restarted server in it
        assert serves(weights_at(pretrained, 3)) < 2e-3 and serves(pretrained) > 0.05
        assert published == [1, 2, 3] and server.starts == 2
    finally:
        sync.close()
        admin.close()
