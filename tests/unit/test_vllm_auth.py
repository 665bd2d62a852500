"""The middleware that puts the run's key on every vLLM route but /health, as plain ASGI (the live
server's routes are checked in tests/integration/test_vllm_weight_updates.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from rlrun.inference import auth
from rlrun.inference.server import server_argv

KEY = "k3y-of-the-run-0123456789"


def call(scope: dict, key: str | None) -> tuple[list[dict], list[str]]:
    """Run one request through RequireApiKey (VLLM_API_KEY = `key`); what it sent, and whether the
    app behind it was reached."""
    reached: list[str] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    env = {} if key is None else {auth.KEY_ENV: key}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(auth.KEY_ENV, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        middleware = auth.RequireApiKey(app)
    asyncio.run(middleware(scope, receive, send))
    return sent, reached


def http(path: str, authorization: str | None = None, kind: str = "http", root_path: str = "") -> dict:
    headers = [(b"host", b"127.0.0.1")] + ([(b"authorization", authorization.encode())] if authorization else [])
    return {"type": kind, "method": "POST", "path": path, "root_path": root_path, "headers": headers}


ADMIN = ["/pause", "/resume", "/reset_prefix_cache", "/collective_rpc", "/abort_requests", "/sleep", "/v1/completions",
         "/metrics", "/tokenize", "/health/", "//health", "/"]  # fmt: skip


@pytest.mark.parametrize("path", ADMIN)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer "])
def test_every_route_but_health_is_refused_without_the_key(path, authorization):
    sent, reached = call(http(path, authorization), KEY)
    assert reached == []
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 401
    assert b"Unauthorized" in sent[1]["body"] and KEY.encode() not in sent[1]["body"]


@pytest.mark.parametrize("path", ADMIN)
def test_the_key_opens_every_route(path):
    for authorization in (f"Bearer {KEY}", f"bearer {KEY}"):
        sent, reached = call(http(path, authorization), KEY)
        assert reached == [path] and sent == []


def test_health_and_lifespan_need_no_key():
    assert call(http("/health"), KEY)[1] == ["/health"]
    assert call(http("/prefix/health", root_path="/prefix"), KEY)[1] == ["/prefix/health"]
    assert call({"type": "lifespan", "path": ""}, KEY)[1] == [""]


def test_a_server_without_a_key_refuses_everything_but_health():
    """Fail closed: no VLLM_API_KEY is not "no protection"."""
    for key in (None, ""):
        assert call(http("/pause", "Bearer "), key)[1] == []
        assert call(http("/collective_rpc", "Bearer anything"), key)[0][0]["status"] == 401
        assert call(http("/health"), key)[1] == ["/health"]


def test_websocket_without_the_key_is_closed_before_accept():
    sent, reached = call(http("/v1/realtime", kind="websocket"), KEY)
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    assert call(http("/v1/realtime", f"Bearer {KEY}", kind="websocket"), KEY)[1] == ["/v1/realtime"]


def test_the_server_is_given_the_middleware_and_no_key_on_its_command_line():
    from rlrun.config import compose

    cfg, _ = compose([])
    argv = server_argv(cfg.inference, cfg.model, "/weights", 8000, tokenizer="/tok", stream_interval=16)
    assert argv[argv.index("--middleware") + 1] == "rlrun.inference.auth.RequireApiKey" == auth.MIDDLEWARE
    assert "--api-key" not in argv


def test_the_module_imports_nothing_heavy():
    code = "import sys, rlrun.inference.auth; print(sorted(m for m in ('torch', 'vllm', 'starlette', 'fastapi', 'httpx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
