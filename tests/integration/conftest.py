"""Shared fixtures for integration tests that need the run's real Redis server."""

from __future__ import annotations

import signal

import pytest

from rlrun.rundir import RunDir
from rlrun.streams.server import connect
from tests.standalone_redis import managed_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One Redis per test module, started exactly as a run starts it (ACL, AOF, loopback)."""
    run = RunDir(tmp_path_factory.mktemp("redis") / "run")
    run.create({"name": "integration-test"})
    with managed_server(run) as srv:
        yield srv


@pytest.fixture
def client(server):
    """A client of that server; every key is deleted afterwards (FLUSHALL is disabled)."""
    c = connect(server.url, server.password)
    yield c
    for key in c.scan_iter("*"):
        c.delete(key)
    c.close()


@pytest.fixture
def nothing_starts(monkeypatch):
    """`rlrun train` run in-process may refuse, never start: the launch's supervisor and model build fail the test."""
    from rlrun.run import launch, plan

    def refuse(*args, **kwargs):
        raise AssertionError("the preflight let this run through: something would have been started")

    monkeypatch.setattr(launch, "Supervisor", refuse)
    monkeypatch.setattr(plan, "model_path", refuse)
    handler = signal.getsignal(signal.SIGTERM)  # the CLI installs its own before supervising
    yield
    signal.signal(signal.SIGTERM, handler)
