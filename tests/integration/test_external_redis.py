"""An external Redis (streams.url): what is wrong with a URL, the URL the run's processes use,
and, against a real password-protected server, the credentials check and the one-run-per-database
claim made before anything starts."""

from __future__ import annotations

import subprocess
import time

import pytest

from rlrun.config import compose
from rlrun.errors import ConfigError, EnvironmentProblem
from rlrun.streams import external
from rlrun.streams.server import find_server_binary, pick_free_port, ping, redis_url
from tests.refusals import settings_refusal

pytestmark = pytest.mark.timeout(60)

PASSWORD = "external-secret-for-tests"


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("redis://:hunter2@10.0.0.5:6379/0", "holds a password"),
        ("redis://alice:hunter2@10.0.0.5:6379/0", "streams.password_file"),
        ("http://10.0.0.5:6379/0", "must start with redis://"),
        ("redis://10.0.0.5:notaport/0", "is not a URL"),
        ("redis:///0", "names no host"),
    ],
)
def test_a_url_that_cannot_be_used_says_why(url, fragment):
    """Refused by preflight, before the run directory (and its config.yaml) exists."""
    assert any(fragment in problem for problem in external.url_problems(url))
    settings_refusal([f"streams.url={url}"], "streams.url", fragment)


def test_usable_urls_have_no_problem():
    for url in ("redis://10.0.0.5:6379/3", "redis://alice@10.0.0.5:6379/0", "rediss://h:6380/0", "unix:///tmp/r.sock"):
        assert external.url_problems(url) == []


def test_the_processes_url_names_the_default_user_only_when_a_password_is_sent():
    assert external.process_url("redis://10.0.0.5:6379/3", has_password=True) == "redis://default@10.0.0.5:6379/3"
    assert external.process_url("redis://10.0.0.5:6379/3", has_password=False) == "redis://10.0.0.5:6379/3"
    assert external.process_url("redis://alice@10.0.0.5:6379/3", has_password=True) == "redis://alice@10.0.0.5:6379/3"


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["streams.password_file=/tmp/p"], "set streams.url too"),
    ],
)
def test_inconsistent_streams_settings_are_refused(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compose(overrides)


@pytest.fixture(scope="module")
def protected_server(tmp_path_factory):
    """A plain server with a password for its default user, as a team's shared Redis would be."""
    port = pick_free_port("127.0.0.1")
    workdir = tmp_path_factory.mktemp("external-redis")
    proc = subprocess.Popen(
        [str(find_server_binary("auto")), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
         "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 20
    while not ping(external.process_url(redis_url("127.0.0.1", port), True), PASSWORD):
        assert proc.poll() is None and time.time() < deadline, "the test's Redis did not start"
        time.sleep(0.1)
    yield redis_url("127.0.0.1", port)
    proc.terminate()
    proc.wait(10)


def test_a_wrong_password_is_refused_before_anything_starts(protected_server):
    with pytest.raises(EnvironmentProblem, match="refused the credentials.*streams.password_file"):
        external.check_and_claim(protected_server, "wrong", "/runs/a", claim=False)


def test_an_unreachable_server_is_named(protected_server):
    url = redis_url("127.0.0.1", pick_free_port("127.0.0.1"))
    with pytest.raises(EnvironmentProblem, match=f"cannot use the Redis at streams.url={url}"):
        external.check_and_claim(url, PASSWORD, "/runs/a", claim=False)


def test_one_database_holds_one_run(protected_server):
    db5 = protected_server.rsplit("/", 1)[0] + "/5"
    external.check_and_claim(db5, PASSWORD, "/runs/a", claim=False)  # free, not claimed by a check
    external.check_and_claim(db5, PASSWORD, "/runs/b", claim=True)
    external.check_and_claim(db5, PASSWORD, "/runs/b", claim=True)  # the same run again (a resume)
    with pytest.raises(EnvironmentProblem, match=r"holds another run's keys \(that of /runs/b\)"):
        external.check_and_claim(db5, PASSWORD, "/runs/a", claim=False)
    external.check_and_claim(protected_server.rsplit("/", 1)[0] + "/6", PASSWORD, "/runs/a", claim=True)  # another db


def test_a_password_file_is_read_and_an_empty_or_missing_one_is_named(tmp_path):
    path = tmp_path / "redis.password"
    path.write_text(PASSWORD + "\n")
    assert external.read_password(str(path)) == PASSWORD
    assert external.read_password(None) is None
    path.write_text("  \n")
    with pytest.raises(EnvironmentProblem, match="is empty"):
        external.read_password(str(path))
    with pytest.raises(EnvironmentProblem, match="cannot be read"):
        external.read_password(str(tmp_path / "absent"))
