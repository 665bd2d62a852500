"""The trainer's weight update across several vLLM servers: a server being restarted is left out
(it starts from the newest weights), the others are updated at once; none answering is an error
the trainer retries. Over httpx's mock transport: the requests rlrun sends, in order."""

from __future__ import annotations

import httpx
import pytest

from rlrun.inference.admin import VllmAdmin

UP, DOWN = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def admin_with(down: set[str], calls: list[str]) -> VllmAdmin:
    def handle(request: httpx.Request) -> httpx.Response:
        server = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if server in down:
            raise httpx.ConnectError("connection refused", request=request)
        calls.append(f"{request.url.port}{request.url.path}")
        return httpx.Response(200, json={})

    return VllmAdmin([UP, DOWN], api_key="k", transport=httpx.MockTransport(handle))


def test_a_server_that_is_down_is_left_out_and_the_others_are_updated():
    calls: list[str] = []
    published: list[str] = []
    down = admin_with({DOWN}, calls).update_weights("/w/v000003", lambda: published.append(calls[-1]))
    assert down == [DOWN]
    assert calls == ["8001/pause", "8001/collective_rpc", "8001/reset_prefix_cache", "8001/resume"]
    assert published == ["8001/reset_prefix_cache"]  # the version is published after the reload, before resuming


def test_every_server_up_is_paused_before_any_reloads_and_resumed_after_the_version_is_published():
    calls: list[str] = []
    published: list[int] = []
    down = admin_with(set(), calls).update_weights("/w/v000003", lambda: published.append(len(calls)))
    assert down == []
    assert calls[:2] == ["8001/pause", "8002/pause"]
    assert calls[-2:] == ["8001/resume", "8002/resume"] and published == [len(calls) - 2]


def test_no_server_answering_is_an_error_and_publishes_nothing():
    published: list[bool] = []
    with pytest.raises(httpx.ConnectError, match="no vLLM server answers"):
        admin_with({UP, DOWN}, []).update_weights("/w/v000003", lambda: published.append(True))
    assert published == []


def test_without_servers_the_version_is_still_published():
    published: list[bool] = []
    admin = VllmAdmin([], transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    assert admin.update_weights("/w/v000001", lambda: published.append(True)) == []
    assert published == [True]


def test_a_new_trainer_resumes_every_server_that_answers_and_names_the_others():
    calls: list[str] = []
    assert admin_with({DOWN}, calls).resume_answering() == [DOWN]
    assert calls == ["8001/resume"]
