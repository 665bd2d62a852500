"""The trainer's side of weight updates: pause generation, reload weights, resume.

Pausing with mode=abort ends in-flight requests at a token boundary; the actor continues them
from the tokens it already has, tagged with the new policy version. One mechanism serves both
weight updates and recovery.
"""

from __future__ import annotations

import httpx

from rlrun.inference.auth import bearer_header


class VllmAdmin:
    """`api_key`: the run's vLLM key (every route but /health needs it; see auth.py)."""

    def __init__(self, urls: list[str], timeout_s: float | httpx.Timeout = 120.0, api_key: str = "") -> None:
        self.urls = list(urls)
        self._client = httpx.Client(timeout=timeout_s, headers=bearer_header(api_key) if api_key else {})

    def pause(self) -> None:
        for url in self.urls:
            self._post(f"{url}/pause", params={"mode": "abort"})

    def resume(self) -> None:
        for url in self.urls:
            self._post(f"{url}/resume")

    def reset_prefix_cache(self) -> None:
        for url in self.urls:
            self._post(f"{url}/reset_prefix_cache")

    def reload_weights(self, weights_path: str) -> None:
        """Load `weights_path` (a complete folder) into every server and drop its prefix cache.

        Cached KV blocks were computed with the old weights; reusing them after the update would
        mix two policies in one sample. The reload is rlrun's (worker_extension.py): vLLM 0.32's
        own leaves tied weights (embedding and LM head) apart.
        """
        body = {"method": "rlrun_reload_weights", "kwargs": {"weights_path": weights_path}}
        for url in self.urls:
            self._post(f"{url}/collective_rpc", json=body)
        self.reset_prefix_cache()

    def _post(self, url: str, **kwargs) -> httpx.Response:
        response = self._client.post(url, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {url} answered {response.status_code}: {response.text[:500]}")
        return response

    def close(self) -> None:
        self._client.close()
