"""Streaming token-in/token-out completions from a vLLM OpenAI-compatible server: each delta
carries the new token ids and each sampled token's log-prob (`logprobs: 0`, `return_token_ids`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import httpx

from rlrun.inference.server import SERVED_MODEL_NAME


@dataclass(frozen=True)
class Delta:
    index: int  # which of the request's n choices
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Optional[str]  # None while generating; "stop", "length" or "abort" at the end


async def stream_completion(
    client: httpx.AsyncClient,
    url: str,
    prompt_ids: list[int],
    *,
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
    min_tokens: int = 0,
) -> AsyncIterator[Delta]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt_ids,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "logprobs": 0,
        "return_token_ids": True,
        "min_tokens": min_tokens,
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout_s) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise httpx.HTTPStatusError(f"vLLM answered {response.status_code}: {text[:300]}", request=response.request, response=response)
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
                token_ids = list(choice.get("token_ids") or [])
                logprobs_obj = choice.get("logprobs") or {}
                logprobs = [float(x) for x in (logprobs_obj.get("token_logprobs") or [])]
                if len(logprobs) != len(token_ids):
                    raise RuntimeError(f"vLLM sent {len(token_ids)} tokens with {len(logprobs)} logprobs")
                yield Delta(choice["index"], token_ids, logprobs, choice.get("finish_reason"))
