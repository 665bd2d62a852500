"""The one way tests read a refused config: the ConfigError (exit 2) and its message."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Callable

import pytest

from rlrun.errors import ConfigError, ExitCode


def refusal(attempt: Callable[[], object], *fragments: str) -> str:
    """Run `attempt`, which must raise ConfigError with exit 2 and a message holding every one of
    `fragments`; return the message."""
    with pytest.raises(ConfigError) as info:
        attempt()
    message = str(info.value)
    assert info.value.exit_code == ExitCode.USAGE, message
    for fragment in fragments:
        assert fragment in message
    return message


def settings_refusal(overrides: list[str], *fragments: str) -> str:
    """`refusal` of `overrides` by config validation, or else by what preflight asks each part the
    config chooses of its own settings (`rlrun.run.preflight.check_settings`): what `rlrun train`
    refuses before it creates anything."""
    from rlrun.config import compose
    from rlrun.run.built import build
    from rlrun.run.preflight import check_settings

    return refusal(lambda: check_settings(build(compose(overrides)[0])), *fragments)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (itself included) with its type, mode, size and mtime: a refused
    command must leave it as it was."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns)
    return out
