"""Weight updates into a real vLLM server (CPU) on vLLM's own RL API, through rlrun's weight-transfer
engine, every way: in flight (a request streaming across an update is kept, labelled by vLLM's
spans, and its tokens after the update are the new weights' over the cache the old ones filled),
what the Fast-LLM stand-in broadcasts (the weight follower's calls), a checkpoint folder (the hf
trainer's trainer.weight_transfer=disk), the shared weights file (=shm), and the hf trainer's own broadcast (=broadcast; last,
since it kills and restarts the server to show a restarted one is brought to the newest weights).
The model ties its embedding and LM head, as Qwen2.5 does. After each update the server's
log-probabilities match transformers' on the new weights, not on the old ones.

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

from rlrun.actor.vllm_client import ROUTE, request_body
from rlrun.backends.fast_llm.follower import VllmBroadcastAdmin
from rlrun.inference.admin import VllmAdmin
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

    def __init__(self, model: str, folder, cfg=None) -> None:
        cfg = cfg or compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])[0]
        self.model, self.port = model, pick_free_port(HOST)
        self.argv = server_argv(cfg.inference, cfg.model, model, self.port, tokenizer=model,
                                stream_interval=cfg.actor.journal_flush_tokens)
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
    model = tied_copy(model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand), tmp_path_factory.mktemp("tied"))
    vllm = VllmProcess(model, tmp_path_factory.mktemp("vllm"))
    try:
        vllm.start()
        yield vllm
    finally:
        vllm.kill()


def greedy(url: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    body = request_body(prompt_ids, n=1, max_tokens=6, temperature=0.0, min_tokens=0, stream=False, cache_salt=None)
    choice = httpx.post(f"{url}{ROUTE}", json=body, headers=bearer_header(KEY), timeout=60).json()["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


def transformers_logprobs(model_path: str, weights: dict, prompt_ids: list[int], completion: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)  # a tied model's file has no lm_head.weight
    model.tie_weights()
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return [logprobs[len(prompt_ids) - 1 + k, token].item() for k, token in enumerate(completion)]


def tied_folder(model: str, weights: dict, folder) -> str:
    """`weights` saved as the trainer saves a step's weights (a tied model: no lm_head)."""
    from transformers import AutoModelForCausalLM

    moved = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    moved.load_state_dict(weights, strict=False)
    moved.tie_weights()
    moved.save_pretrained(folder)
    return str(folder)


def mixed_logprobs(model_path: str, old: dict, new: dict, prompt_ids: list[int], completion: list[int], k: int) -> list[float]:
    """Log-probs of completion[k:] as vLLM computes them when its weights change from `old` to `new`
    after token k - 1 was sampled (mode=keep): the new weights run over the keys and values the old
    ones computed for the prompt and completion[:k - 1]."""
    from transformers import AutoModelForCausalLM

    def model_with(weights):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
        return model

    with torch.no_grad():
        cache = model_with(old)(torch.tensor([prompt_ids + completion[: k - 1]]), use_cache=True).past_key_values
        logits = model_with(new)(torch.tensor([completion[k - 1 :]]), past_key_values=cache, use_cache=True).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [logprobs[j, token].item() for j, token in enumerate(completion[k:])]


def test_a_request_in_flight_across_an_update_is_kept_and_labelled_and_continues_on_the_new_weights(server, tmp_path):
    """The in-flight update, as the trainer makes it every step: a group streaming when the update
    comes is not aborted; vLLM's spans label its tokens before and after; after the update its
    log-probs are the new weights' over the KV cache the old weights computed (what keep does),
    within 2e-3 of transformers computing exactly that."""
    import asyncio

    from transformers import AutoTokenizer

    from rlrun.actor.vllm_client import generate

    url, model = server.url, server.model
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    pretrained = load_file(os.path.join(model, "model.safetensors"))
    moved = weights_at(pretrained, STEP)
    folder = tied_folder(model, moved, tmp_path / "v1")
    budget = 56 - len(prompt)  # to the model's length, whatever it samples (min_tokens)
    admin = VllmAdmin([url], api_key=KEY)

    async def one_try() -> dict:
        samples: dict[int, dict] = {}
        first_chunk = asyncio.Event()

        async def stream(client, n: int, record: bool) -> None:
            async for delta in generate(client, url, prompt, n=n, max_tokens=budget, min_tokens=budget, temperature=1.0,
                                        timeout_s=120, stream=True, cache_salt="v0"):  # fmt: skip
                if record:  # the update waits for the group itself to be streaming (not only the load)
                    first_chunk.set()
                    sample = samples.setdefault(delta.index, {"tokens": [], "logprobs": [], "finish": None, "spans": None})
                    sample["tokens"] += delta.token_ids
                    sample["logprobs"] += delta.logprobs
                    if delta.finish_reason is not None:
                        sample["finish"], sample["spans"] = delta.finish_reason, delta.spans

        async with httpx.AsyncClient(headers=bearer_header(KEY), timeout=120) as client:
            group = asyncio.create_task(stream(client, 8, True))
            load = [asyncio.create_task(stream(client, 64, False)) for _ in range(3)]  # slower steps: caught mid-flight
            await first_chunk.wait()
            await asyncio.to_thread(admin.update_from_folder, folder, 1, lambda: None)  # pause(keep), load, label, resume
            await asyncio.gather(group, *load)
        return samples

    try:
        for _ in range(3):  # a group that finished before the pause landed proves nothing: again
            samples = asyncio.run(one_try())
            spanning = [s for s in samples.values() if s["spans"] and len(s["spans"]) == 2]
            if spanning:
                break
        assert len(samples) == 8 and all(s["finish"] == "length" and len(s["tokens"]) == budget for s in samples.values()), \
            "a request in flight was cut short by the update"  # fmt: skip
        assert spanning, "no sample was in flight across the update in 3 tries"
        for sample in spanning:
            before, after = sample["spans"]
            k = before.end
            assert (before.label, before.start, after.label, after.start, after.end) == ("default", 0, "1", k, budget)
            assert 0 < k < budget
            tokens, served = sample["tokens"], sample["logprobs"]
            old = transformers_logprobs(model, pretrained, prompt, tokens[:k])
            assert max(abs(a - b) for a, b in zip(served[:k], old)) < 2e-3  # before: the old weights
            expected = mixed_logprobs(model, pretrained, moved, prompt, tokens, k)
            mixed = max(abs(a - b) for a, b in zip(served[k:], expected))
            print(f"after the update: vLLM vs the new weights over the old cache, max abs diff {mixed:.2e}")
            assert mixed < 2e-3  # after: the new weights, over the keys and values the old ones filled
            fresh = transformers_logprobs(model, moved, prompt, tokens)[k:]
            assert max(abs(a - b) for a, b in zip(served[k:], fresh)) > 0.01  # not a fresh pass: the KV was kept
            still_old = transformers_logprobs(model, pretrained, prompt, tokens)[k:]
            assert max(abs(a - b) for a, b in zip(served[k:], still_old)) > 0.05  # not the weights it started with
    finally:
        admin.close()


def test_vllm_serves_the_weights_fast_llm_broadcast(server):
    from transformers import AutoTokenizer

    url, model = server.url, server.model
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    pretrained = load_file(os.path.join(model, "model.safetensors"))
    admin = VllmBroadcastAdmin([url], receive_timeout_s=60, api_key=KEY)
    port = pick_free_port(HOST)

    def load(step: int):  # the weight follower's calls for one weights_ready
        return in_thread(lambda: admin.update(lambda live: admin.receive(live, step), lambda: None))

    assert admin.join(HOST, port, "gloo", 60) == []  # answers at once; the engine joins in the background
    sender = Broadcaster(HOST, port, 1, "gloo", timeout=60)  # as Fast-LLM's start: waits for the worker
    loading = load(STEP)
    sender.send(weights_at(pretrained, STEP))
    assert loading() == []
    assert admin.weight_version(url) == str(STEP)

    completion, served = greedy(url, prompt)
    moved = transformers_logprobs(model, weights_at(pretrained, STEP), prompt, completion)
    before = transformers_logprobs(model, pretrained, prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, moved)) < 2e-3  # the broadcast weights
    assert max(abs(a - b) for a, b in zip(served, before)) > 0.05  # not the ones it started with

    # A restarted trainer goes back to its checkpoint's step and broadcasts it again: loaded again.
    loading = load(2)
    sender.send(weights_at(pretrained, 2))
    assert loading() == []
    completion, served = greedy(url, prompt)
    moved = transformers_logprobs(model, weights_at(pretrained, 2), prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, moved)) < 2e-3
    admin.close()


def test_vllm_serves_a_checkpoint_folder_reloaded_by_the_trainers_call(server, tmp_path):
    from transformers import AutoTokenizer

    url, model = server.url, server.model
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    weights = weights_at(load_file(os.path.join(model, "model.safetensors")), 30)
    folder = tied_folder(model, weights, tmp_path / "step-30")

    admin = VllmAdmin([url], api_key=KEY)
    assert admin.update_from_folder(folder, 30, publish=lambda: None) == []  # the trainer's path
    assert admin.weight_version(url) == "30"
    admin.close()

    completion, served = greedy(url, prompt)
    expected = transformers_logprobs(model, weights, prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, expected)) < 2e-3


def test_vllm_serves_the_shared_weights_file_the_trainer_wrote(server):
    """trainer.weight_transfer=shm: the trainer's state dict (its tied head written once) copied into
    the run's file in /dev/shm, which the server maps and loads; twice into the one mapping, each
    step's weights served. The trainer writes the next step's weights before the pause: until its
    update the server still serves the last ones (vLLM copied them, it holds no view of the file)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrun.weights.shared import SharedWeights, shared_path, without_aliases

    url, model = server.url, server.model
    prompt = AutoTokenizer.from_pretrained(model).encode(PROMPT, add_special_tokens=False)
    writer = SharedWeights(shared_path(f"run-test-{os.getpid()}/"))
    admin = VllmAdmin([url], api_key=KEY)
    try:
        served_before = None
        for step in (31, 32):
            weights = weights_at(load_file(os.path.join(model, "model.safetensors")), step)
            trainer_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
            trainer_model.load_state_dict(weights, strict=False)
            trainer_model.tie_weights()
            state = without_aliases(trainer_model.state_dict())
            assert "lm_head.weight" not in state  # the tied head: once, as the embedding
            writer.write(state)
            if served_before is not None:  # written, not yet loaded: the server serves what it loaded
                completion, served = greedy(url, prompt)
                assert completion == served_before[0] and max(abs(a - b) for a, b in zip(served, served_before[1])) < 1e-4
            assert admin.update_from_shared(str(writer.path), step, publish=lambda: None) == []
            assert admin.weight_version(url) == str(step)
            completion, served = served_before = greedy(url, prompt)
            expected = transformers_logprobs(model, weights, prompt, completion)
            assert max(abs(a - b) for a, b in zip(served, expected)) < 2e-3, step
    finally:
        admin.close()
        writer.close()


# Every route a local process could use to steer the run: (method, path, body). Each must answer
# 401 without the key and do its job with it.
ADMIN_ROUTES = [
    ("POST", "/pause?mode=keep", None),
    ("GET", "/is_paused", None),
    ("POST", "/resume", None),
    ("POST", "/reset_prefix_cache", None),
    ("POST", "/abort_requests", {"request_ids": ["none-such"]}),
    ("POST", "/start_weight_update", None),
    ("POST", "/update_weights", {"update_info": {"path": "{model}"}}),
    ("POST", "/finish_weight_update", {"weight_version": "{label}"}),
    ("POST", "/update_weight_version", {"new_version": "{label}"}),
    ("GET", "/weight_info", None),
    ("GET", "/is_sleeping", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": SERVED_MODEL_NAME, "prompt": [1, 2], "max_tokens": 1}),
    ("POST", ROUTE, request_body([1, 2], n=1, max_tokens=1, temperature=1.0, min_tokens=0, stream=False, cache_salt=None)),
]


def test_an_update_session_left_open_by_a_dead_trainer_does_not_block_the_next_update(server, tmp_path):
    """A trainer killed between /start_weight_update and /finish_weight_update leaves vLLM's session
    open, and vLLM refuses every later start (seen in CI: a killed trainer rank, then its restarted
    group refused until the restart budget was spent, exit 6). The next update finishes it and goes on."""
    url, model = server.url, server.model
    with httpx.Client(base_url=url, timeout=120, headers=bearer_header(KEY)) as dead_trainer:
        served = dead_trainer.get("/weight_info").json()["weight_version"]
        assert dead_trainer.post("/start_weight_update").status_code == 200  # its last call
        try:
            refused = dead_trainer.post("/start_weight_update").status_code
        except httpx.HTTPError:  # vLLM may answer the refusal by closing the connection
            refused = None
        assert refused != 200, "vLLM started a second update session while one was open"
    folder = tied_folder(model, weights_at(load_file(os.path.join(model, "model.safetensors")), 31), tmp_path / "step-31")
    admin = VllmAdmin([url], api_key=KEY)
    try:
        assert admin.update_from_folder(folder, 31, publish=lambda: None) == []
        assert admin.weight_version(url) == "31" != served
    finally:
        admin.close()


def test_every_admin_route_needs_the_runs_key(server):
    """A local process without the key can neither freeze generation nor swap the policy; the key
    opens every route; /health stays open for the probe; the key is in no log."""
    url, model, log = server.url, server.model, server.log
    with httpx.Client(base_url=url, timeout=120) as anyone, httpx.Client(base_url=url, timeout=120, headers=bearer_header(KEY)) as run:
        paused = False  # what the server should say: only the key's /pause and /resume change it
        for method, path, body in ADMIN_ROUTES:
            label = run.get("/weight_info").json()["weight_version"]  # the route relabels with what it served: unchanged
            body = None if body is None else json.loads(json.dumps(body).replace("{model}", model).replace("{label}", label))
            for who, headers in (("nobody", {}), ("a wrong key", bearer_header("guess")), ("a non-bearer", {"Authorization": KEY})):
                refused = anyone.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, f"{method} {path} with {who}: {refused.status_code} {refused.text[:200]}"
            assert run.get("/is_paused").json() == {"is_paused": paused}, f"{path} without the key changed the pause state"
            allowed = run.request(method, path, json=body)
            assert allowed.status_code == 200, f"{method} {path} with the key: {allowed.status_code} {allowed.text[:300]}"
            paused = {"/pause?mode=keep": True, "/resume": False}.get(path, paused)
            assert run.get("/is_paused").json() == {"is_paused": paused}  # the key's pause/resume took effect
        assert run.get("/is_paused").json() == {"is_paused": False}
        assert anyone.get("/health").status_code == 200
        # The update went through: the served model is the one on disk again, and it generates.
        assert len(greedy(url, [1, 2, 3])[0]) >= 1
    assert KEY not in log.read_text(errors="replace")


def test_the_hf_trainers_broadcast_is_served_and_a_restarted_server_gets_the_newest_weights(server):
    """trainer.weight_transfer=broadcast, rank 0's side (`BroadcastSync`, what the trainer calls
    every step) against the real server: each update is served; a server killed and started again
    comes back with the weights it was started from, and the next update forms a new group with
    it and brings it to the newest. Last in this module: it restarts the server."""
    from transformers import AutoTokenizer

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
                first = sync.sender
        assert sync.sender is first  # the second update reused the group

        server.kill()  # the supervisor would restart it; meanwhile no server answers: the trainer retries
        with pytest.raises(httpx.ConnectError, match="no vLLM server answers"):
            sync.update(weights_at(pretrained, 3), 3, lambda: published.append(3))
        server.start()  # from the model folder it was started with: stale weights
        assert serves(pretrained) < 2e-3

        assert sync.update(weights_at(pretrained, 3), 3, lambda: published.append(3)) == []
        assert sync.sender is not first and sync.membership.label == "3"  # a new group, with the restarted server in it
        assert serves(weights_at(pretrained, 3)) < 2e-3 and serves(pretrained) > 0.05
        assert published == [1, 2, 3] and server.starts == 2
    finally:
        sync.close()
        admin.close()
