"""Token-in/token-out generation on vLLM's `/inference/v1/generate` (`--enable-scale-out`): one
request per group of samples that share a prompt (`n`), streamed in chunks of the server's
`--stream-interval` tokens, or answered whole when nothing needs the tokens before the end. Each
delta carries its token ids and each sampled token's log-prob; a choice's last delta carries
`weight_versions`, vLLM's record of which weight version sampled which of its output tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

import httpx

from rlrun.inference.server import SERVED_MODEL_NAME

ROUTE = "/inference/v1/generate"


@dataclass(frozen=True)
class VersionSpan:
    """Output tokens [start, end) of one choice were sampled by the weights labelled `label`."""

    label: str
    start: int
    end: int


@dataclass(frozen=True)
class Delta:
    index: int  # which of the request's n choices
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Optional[str]  # None while generating; "stop", "length" or "abort" at the end
    spans: Optional[list[VersionSpan]] = None  # on the choice's last delta only


def request_body(
    prompt_ids: list[int],
    *,
    n: int,
    max_tokens: int,
    temperature: float,
    min_tokens: int,
    stream: bool,
    cache_salt: str | None,
    seed: int | None = None,
) -> dict:
    body: dict[str, Any] = {
        "model": SERVED_MODEL_NAME,
        "token_ids": prompt_ids,
        "sampling_params": {
            "n": n,
            "max_tokens": max_tokens,
            "min_tokens": min_tokens,
            "temperature": temperature,
            "logprobs": 0,  # the sampled token's log-prob only
            "detokenize": False,  # token ids are all the actor reads
        },
        "stream": stream,
    }
    if cache_salt:
        body["cache_salt"] = cache_salt
    if seed is not None:  # the request's own random stream: the same samples whatever else the server runs
        body["sampling_params"]["seed"] = seed
    return body


async def generate(
    client: httpx.AsyncClient,
    url: str,
    prompt_ids: list[int],
    *,
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
    min_tokens: int = 0,
    stream: bool = True,
    cache_salt: str | None = None,
    seed: int | None = None,
) -> AsyncIterator[Delta]:
    body = request_body(
        prompt_ids,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        min_tokens=min_tokens,
        stream=stream,
        cache_salt=cache_salt,
        seed=seed,
    )
    if not stream:
        response = await client.post(f"{url}{ROUTE}", json=body, timeout=timeout_s)
        _raise_for_status(response.status_code, response.text, response)
        for choice in response.json().get("choices", []):
            yield _delta(choice)
        return
    async with client.stream("POST", f"{url}{ROUTE}", json=body, timeout=timeout_s) as response:
        if response.status_code != 200:
            _raise_for_status(response.status_code, (await response.aread()).decode(errors="replace"), response)
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload.strip() == "[DONE]":
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(f"vLLM stream error: {chunk['error']}")
            for choice in chunk.get("choices", []):
                yield _delta(choice)


def _raise_for_status(status: int, text: str, response: httpx.Response) -> None:
    if status != 200:
        raise httpx.HTTPStatusError(
            f"vLLM answered {status}: {text[:300]}", request=response.request, response=response
        )


def _delta(choice: dict) -> Delta:
    token_ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(entry["logprob"]) for entry in content]
    if len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM sent {len(token_ids)} tokens with {len(logprobs)} logprobs")
    spans = choice.get("weight_versions")
    parsed = [VersionSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in spans] if spans else None
    return Delta(int(choice["index"]), token_ids, logprobs, choice.get("finish_reason"), parsed)
