"""The one way tests read a refused config: the ConfigError (exit 2) and its message."""

from __future__ import annotations

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
