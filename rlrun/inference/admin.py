"""The trainer's side of weight updates: pause generation, reload weights, resume.

Pausing with mode=abort ends in-flight requests at a token boundary; the actor continues them
from the tokens it already has, tagged with the new policy version. One mechanism serves both
weight updates and recovery.

A server that does not take connections (being restarted by the supervisor) is left out of an
update: it starts from the newest weights the trainer pointed `weights/current` at, so the other
servers need not wait for it. Only when no server answers does the update fail (and is retried).
"""

from __future__ import annotations

from typing import Callable

import httpx

DOWN = (httpx.ConnectError, httpx.RemoteProtocolError)  # refused, or the server died mid-request

from rlrun.inference.auth import bearer_header


class VllmAdmin:
    """`api_key`: the run's vLLM key (every route but /health needs it; see auth.py)."""

    def __init__(self, urls: list[str], timeout_s: float | httpx.Timeout = 120.0, api_key: str = "", transport: httpx.BaseTransport | None = None) -> None:
        self.urls = list(urls)
        headers = bearer_header(api_key) if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def update_weights(self, weights_path: str, publish: Callable[[], None]) -> list[str]:
        """Pause every server that answers, load `weights_path` into each, `publish()` the new
        version, resume them; return the servers that were down (left out). Raises
        httpx.ConnectError when none answers: there is no one to update yet."""

        def reload_each(live: list[str]) -> list[str]:
            return [url for url in live if not self._answers(lambda: self._reload(url, weights_path))]

        return self.update(reload_each, publish)

    def update(self, load: Callable[[list[str]], list[str]], publish: Callable[[], None]) -> list[str]:
        """Pause every server that answers, `load(those)` (it returns the ones it found down),
        `publish()`, resume; return the servers that were down. Raises httpx.ConnectError when
        none answers; whatever `load` raises, the paused servers are resumed."""
        live, down = list(self.urls), []

        def on_each(action: Callable[[str], object]) -> None:
            for url in list(live):
                if not self._answers(lambda: action(url)):
                    live.remove(url)
                    down.append(url)

        on_each(lambda url: self._post(f"{url}/pause", params={"mode": "abort"}))
        try:
            for url in load(list(live)):
                live.remove(url)
                down.append(url)
            if down and not live:  # (no server at all, as in trainer tests: nothing to wait for)
                raise httpx.ConnectError(f"no vLLM server answers ({', '.join(down)})")
            publish()
        finally:
            on_each(lambda url: self._post(f"{url}/resume"))
        return down

    @staticmethod
    def _answers(action: Callable[[], object]) -> bool:
        """Run `action`; False when its server does not take connections (down, restarting)."""
        try:
            action()
            return True
        except DOWN:
            return False

    def rpc(self, url: str, method: str, kwargs: dict, timeout_s: float | None = None) -> dict:
        """Call rlrun's worker extension `method` on server `url`; its (first worker's) answer."""
        body = {"method": method, "kwargs": kwargs, **({"timeout": timeout_s} if timeout_s is not None else {})}
        extra = {"timeout": timeout_s + 30.0} if timeout_s is not None else {}
        results = self._post(f"{url}/collective_rpc", json=body, **extra).json().get("results") or [None]
        return results[0] if isinstance(results[0], dict) else {"reply": results[0]}

    def resume_answering(self) -> list[str]:
        """Resume every server that answers (a trainer that died between /pause and /resume left
        it paused, and its successor may have no update to make before the actor feeds it);
        return those that did not answer or refused."""
        missed = []
        for url in self.urls:
            try:
                self._post(f"{url}/resume")
            except (httpx.HTTPError, RuntimeError):  # down, starting, or refusing: nothing to resume there
                missed.append(url)
        return missed

    def pause(self) -> None:
        for url in self.urls:
            self._post(f"{url}/pause", params={"mode": "abort"})

    def resume(self) -> None:
        for url in self.urls:
            self._post(f"{url}/resume")

    def reset_prefix_cache(self, urls: list[str] | None = None) -> None:
        for url in self.urls if urls is None else urls:
            self._post(f"{url}/reset_prefix_cache")

    def reload_weights(self, weights_path: str) -> None:
        """Load `weights_path` (a complete folder) into every server and drop its prefix cache.

        Cached KV blocks were computed with the old weights; reusing them after the update would
        mix two policies in one sample. The reload is rlrun's (worker_extension.py): vLLM 0.32's
        own leaves tied weights (embedding and LM head) apart.
        """
        for url in self.urls:
            self._reload(url, weights_path)

    def _reload(self, url: str, weights_path: str) -> None:
        self._post(f"{url}/collective_rpc", json={"method": "rlrun_reload_weights", "kwargs": {"weights_path": weights_path}})
        self._post(f"{url}/reset_prefix_cache")

    def _post(self, url: str, **kwargs) -> httpx.Response:
        response = self._client.post(url, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {url} answered {response.status_code}: {response.text[:500]}")
        return response

    def close(self) -> None:
        self._client.close()
