"""What a config gets wrong, gathered one sentence at a time by whoever owns the rule (config
validation, a trainer backend, the SLURM job), and said as one ConfigError (exit 2)."""

from __future__ import annotations

from collections.abc import Callable

from rlrun.errors import ConfigError

PREFIX = "invalid configuration: "
NeedFn = Callable[[object, str], None]  # a `Problems.need`, handed to the helpers of one validation


class Problems(list[str]):
    """The sentences gathered so far; `need(ok, message)` keeps `message` when `ok` is false."""

    def need(self, ok: object, message: str) -> None:
        if not ok:
            self.append(message)


def refuse(problems: list[str]) -> None:
    """One ConfigError saying every problem, in order; nothing when there is none."""
    if problems:
        raise ConfigError(PREFIX + " ".join(problems))
