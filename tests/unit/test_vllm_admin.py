"""The trainer's weight update across several vLLM servers, on vLLM's RL routes: every server that
answers is paused with its requests kept, loads through the weight-transfer engine, gets the
version as its label, and is resumed after the version is published; a server being restarted is
left out (it starts from the newest weights); none answering is an error the trainer retries.
Over httpx's mock transport: the requests rlrun sends, in order."""

from __future__ import annotations

import json

import httpx
import pytest

from rlrun.inference.admin import VllmAdmin

UP, DOWN = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def admin_with(down: set[str], calls: list[str]) -> VllmAdmin:
    def handle(request: httpx.Request) -> httpx.Response:
        server = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if server in down:
            raise httpx.ConnectError("connection refused", request=request)
        query = f"?{request.url.query.decode()}" if request.url.query else ""
        body = f" {json.loads(request.content)}" if request.content else ""
        calls.append(f"{request.url.port}{request.url.path}{query}{body}")
        return httpx.Response(200, json={})

    return VllmAdmin([UP, DOWN], api_key="k", transport=httpx.MockTransport(handle))


def test_a_server_that_is_down_is_left_out_and_the_others_are_updated():
    calls: list[str] = []
    published: list[str] = []
    down = admin_with({DOWN}, calls).update_from_folder("/w/v000003", 3, lambda: published.append(calls[-1]))
    assert down == [DOWN]
    assert calls == ["8001/pause?mode=keep&clear_cache=false", "8001/start_weight_update", "8001/update_weights {'update_info': {'path': '/w/v000003'}}",
                     "8001/finish_weight_update {'weight_version': '3'}", "8001/resume"]  # fmt: skip
    assert published == ["8001/finish_weight_update {'weight_version': '3'}"]  # after the load, before resuming


def test_every_server_up_is_paused_before_any_reloads_and_resumed_after_the_version_is_published():
    calls: list[str] = []
    published: list[int] = []
    down = admin_with(set(), calls).update_from_folder("/w/v000003", 3, lambda: published.append(len(calls)))
    assert down == []
    assert calls[:2] == ["8001/pause?mode=keep&clear_cache=false", "8002/pause?mode=keep&clear_cache=false"]  # requests in flight are kept, never aborted
    assert calls[-2:] == ["8001/resume", "8002/resume"] and published == [len(calls) - 2]


def test_a_failed_load_labels_nothing_publishes_nothing_and_resumes_every_paused_server():
    calls: list[str] = []
    published: list[bool] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.url.port}{request.url.path}")
        return httpx.Response(500 if request.url.path == "/update_weights" else 200, json={})

    admin = VllmAdmin([UP], api_key="k", transport=httpx.MockTransport(handle))
    with pytest.raises(RuntimeError, match="answered 500"):
        admin.update_from_folder("/w/v000004", 4, lambda: published.append(True))
    assert calls == ["8001/pause", "8001/start_weight_update", "8001/update_weights", "8001/resume"]
    assert published == []


def test_no_server_answering_is_an_error_and_publishes_nothing():
    published: list[bool] = []
    with pytest.raises(httpx.ConnectError, match="no vLLM server answers"):
        admin_with({UP, DOWN}, []).update_from_folder("/w/v000003", 3, lambda: published.append(True))
    assert published == []


def test_without_servers_the_version_is_still_published():
    published: list[bool] = []
    admin = VllmAdmin([], transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    assert admin.update_from_folder("/w/v000001", 1, lambda: published.append(True)) == []
    assert published == [True]


def test_a_new_trainer_resumes_every_server_that_answers_and_names_the_others():
    calls: list[str] = []
    assert admin_with({DOWN}, calls).resume_answering() == [DOWN]
    assert calls == ["8001/resume"]
