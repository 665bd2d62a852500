"""The trainer's side of weight updates: pause generation (mode=abort: the actor continues the
aborted requests from their tokens), reload weights, resume. A server that takes no connections
(restarting: it starts from `weights/current`) is left out; the update fails only when none answers.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Callable

import httpx

DOWN = (httpx.ConnectError, httpx.RemoteProtocolError)  # refused, or the server died mid-request

from rlrun.inference.auth import bearer_header


def in_thread(action: Callable[[], object]) -> Future:
    """`action` in a daemon thread of its own, as a future (a call left blocked by a failed broadcast
    holds up no later one, as a pool's worker would, and no exit)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(action())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(exc)

    threading.Thread(target=run, name="rlrun-vllm-call", daemon=True).start()
    return future


def results(futures: list[Future], while_waiting: Callable[[], None]) -> list:
    """The futures' results, calling `while_waiting` (the heartbeat) about once a second meanwhile."""
    while wait(futures, timeout=1.0).not_done:
        while_waiting()
    return [future.result() for future in futures]


class VllmAdmin:
    """`api_key`: the run's vLLM key (every route but /health needs it; see auth.py)."""

    def __init__(self, urls: list[str], timeout_s: float | httpx.Timeout = 120.0, api_key: str = "", transport: httpx.BaseTransport | None = None) -> None:
        self.urls = list(urls)
        headers = bearer_header(api_key) if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def update_weights(self, weights_path: str, publish: Callable[[], None]) -> list[str]:

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
        """Resume every server that answers (a trainer that died between /pause and /resume left it
        paused); return those that did not answer or refused."""
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

    def reset_prefix_cache(self, urls: list[str] | None = None) -> None:
        for url in self.urls if urls is None else urls:
            self._post(f"{url}/reset_prefix_cache")

    def _reload(self, url: str, weights_path: str) -> None:
        """rlrun's reload (worker_extension.py keeps tied weights tied), then the prefix cache
        dropped: KV blocks computed with the old weights would mix two policies in one sample."""
        self.rpc(url, "rlrun_reload_weights", {"weights_path": weights_path})
        self._post(f"{url}/reset_prefix_cache")

    def _post(self, url: str, **kwargs) -> httpx.Response:
        response = self._client.post(url, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {url} answered {response.status_code}: {response.text[:500]}")
        return response

    def close(self) -> None:
        self._client.close()
