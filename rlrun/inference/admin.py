"""The trainer's (and the weight follower's) side of weight updates, on vLLM's own RL routes:
`/pause?mode=keep` (requests in flight are frozen in place, not aborted), the weights moved by
the weight-transfer API into rlrun's engine (`transfer_engine.py`: `/start_weight_update`,
`/update_weights`, `/finish_weight_update` with the version), `/resume` (generation continues
with the new weights; vLLM labels each output token with the version that sampled it).

A server that takes no connections (restarting: it starts from `weights/current`) is left out;
the update fails only when none answers.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from typing import Callable

import httpx

from rlrun.inference.auth import bearer_header

DOWN = (httpx.ConnectError, httpx.RemoteProtocolError)  # refused, or the server died mid-request
# Requests in flight frozen in place, their KV cache kept (vLLM 0.32's clear_cache=true, the route's
# default, would preempt every running request and prefill it again after the update): see
# docs/architecture.md, "Weight updates", for the policy mix this gives.
PAUSE = {"mode": "keep", "clear_cache": "false"}


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


def version_label(version: int) -> str:
    """The weight version as vLLM stores it (and reports it in `weight_versions` spans)."""
    return str(int(version))


class VllmAdmin:
    """`api_key`: the run's vLLM key (every route but /health needs it; see auth.py)."""

    def __init__(
        self,
        urls: list[str],
        timeout_s: float | httpx.Timeout = 120.0,
        api_key: str = "",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.urls = list(urls)
        headers = bearer_header(api_key) if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self.last_pause_s: float | None = None  # the last update: first /pause sent -> last /resume answered

    def update_from_folder(self, folder: str, version: int, publish: Callable[[], None]) -> list[str]:
        """Every server that answers loads the complete safetensors `folder` as `version`."""

        def load_each(live: list[str]) -> list[str]:
            return [url for url in live if not self._answers(lambda: self.load(url, {"path": folder}, version))]

        return self.update(load_each, publish)

    def update_from_shared(self, path: str, version: int, publish: Callable[[], None]) -> list[str]:
        """Every server that answers loads the shared weights file `path` (rlrun/weights/shared.py) as `version`."""

        def load_each(live: list[str]) -> list[str]:
            return [url for url in live if not self._answers(lambda: self.load(url, {"shm": path}, version))]

        return self.update(load_each, publish)

    def update(self, load: Callable[[list[str]], list[str]], publish: Callable[[], None]) -> list[str]:
        """Pause every server that answers (in flight requests kept), `load(those)` (it returns the
        ones it found down), `publish()`, resume; return the servers that were down. Raises
        httpx.ConnectError when none answers; whatever `load` raises, the paused servers are resumed."""
        live, down = list(self.urls), []
        paused = time.perf_counter()

        def on_each(action: Callable[[str], object]) -> None:
            for url in list(live):
                if not self._answers(lambda: action(url)):
                    live.remove(url)
                    down.append(url)

        on_each(lambda url: self._post(f"{url}/pause", params=PAUSE))
        try:
            for url in load(list(live)):
                live.remove(url)
                down.append(url)
            if down and not live:  # (no server at all, as in trainer tests: nothing to wait for)
                raise httpx.ConnectError(f"no vLLM server answers ({', '.join(down)})")
            publish()
        finally:
            try:
                self._resume(live)
            finally:
                self.last_pause_s = time.perf_counter() - paused
        return down

    def load(self, url: str, update_info: dict, version: int, timeout_s: float | None = None) -> None:
        """One weight update of server `url` through its weight-transfer engine: `update_info`
        `{"path": folder}`, `{"shm": file}` or `{"timeout_s": t}` (receive a broadcast), then
        `version` as its label."""
        extra = {"timeout": timeout_s + 30.0} if timeout_s is not None else {}
        self._start_update(url)
        # A failed update ends vLLM's update session itself (the next start works) and labels nothing.
        self._post(f"{url}/update_weights", json={"update_info": update_info}, **extra)
        self._post(f"{url}/finish_weight_update", json={"weight_version": version_label(version)})

    def _start_update(self, url: str) -> None:
        """/start_weight_update. A trainer that died between its start and its finish left vLLM's
        update session open, and vLLM refuses every later start until it is finished; so a failed
        start is met by finishing the session under the label the server serves now, then starting
        again: what this update loads next replaces whatever the dead trainer sent. When finishing
        fails too, the start's own failure is raised. The start goes on a connection of its own:
        vLLM's server breaks the connection it refused on, and the next request there would fail."""
        try:
            self._post(f"{url}/start_weight_update", headers={"Connection": "close"})
            return
        except (RuntimeError, httpx.ReadError, httpx.RemoteProtocolError) as refused:
            try:
                self._post(f"{url}/finish_weight_update", json={"weight_version": self.weight_version(url)})
            except (RuntimeError, httpx.HTTPError):
                raise refused from None
        self._post(f"{url}/start_weight_update", headers={"Connection": "close"})

    def join_broadcast(
        self,
        url: str,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        namespace: str = "",
    ) -> None:
        """Have server `url` join the broadcast group at host:port as `rank` (it answers at once and
        joins in the background: the sender may start much later). `namespace`: the keys of this
        formation of the group ("" for Fast-LLM's; `broadcast.member_of`)."""
        info = {
            "host": host,
            "port": port,
            "rank": rank,
            "world_size": world_size,
            "backend": backend,
            "timeout_s": timeout_s,
            "namespace": namespace,
        }
        self._post(f"{url}/init_weight_transfer_engine", json={"init_info": info})

    def weight_version(self, url: str) -> str:
        """The label of the weights `url` serves ("default": none given since it started)."""
        response = self._client.get(f"{url}/weight_info")
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {url} answered {response.status_code}: {response.text[:500]}")
        return str(response.json().get("weight_version"))

    def _resume(self, servers: list[str]) -> None:
        """Resume every one of `servers`, each tried even when one refuses (a server left paused
        stalls the run); then raise the first refusal, if any."""
        refused = []
        for url in servers:
            try:
                self._post(f"{url}/resume")
            except DOWN:
                pass  # gone since the pause: it starts unpaused
            except RuntimeError as exc:
                refused.append(exc)
        if refused:
            raise refused[0]

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

    @staticmethod
    def _answers(action: Callable[[], object]) -> bool:
        try:
            action()
            return True
        except DOWN:
            return False

    def _post(self, url: str, **kwargs) -> httpx.Response:
        response = self._client.post(url, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {url} answered {response.status_code}: {response.text[:500]}")
        return response

    def close(self) -> None:
        self._client.close()
