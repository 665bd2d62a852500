"""The run's API key on every vLLM route but `/health`: an ASGI middleware handed to vLLM.

vLLM's own `--api-key` guards `/v1` only; its RL routes (`/pause`, `/collective_rpc`, ...) answer
anyone on the machine. Without `Authorization: Bearer $VLLM_API_KEY` a request gets 401 (no key
set: every guarded route is refused). Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # the liveness probe; everything else needs the key
MIDDLEWARE = f"{__name__}.RequireApiKey"  # what `--middleware` names


def bearer_header(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def authorized(headers: list[tuple[bytes, bytes]], key_digest: bytes | None) -> bool:
    """True when `headers` (ASGI's raw list) carry `Bearer <key>` whose SHA-256 is `key_digest`."""
    if key_digest is None:
        return False
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                # Compare digests in constant time: the token's length does not leak either.
                return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(), key_digest)
    return False


def needs_key(scope: dict) -> bool:
    if scope.get("type") not in ("http", "websocket"):
        return False  # lifespan events
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path not in OPEN_PATHS


class RequireApiKey:
    def __init__(self, app) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        self._digest = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if not needs_key(scope) or authorized(scope.get("headers") or [], self._digest):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the client sees 403
            return
        body = json.dumps(
            {"error": "Unauthorized: this server needs the run's API key (Authorization: Bearer ...)"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
