"""What differs between the Fast-LLM revisions rlrun drives: one small table, one entry each.

Fast-LLM reads its config strictly, so the generated config must match the revision. Each entry
names the commits it was checked against; `trainer.fast_llm.version=auto` has preflight ask the
installed Fast-LLM which entry's config it accepts (`installed.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Revision:
    name: str  # the value of trainer.fast_llm.version that selects it
    checked_against: tuple[str, ...]  # commits (and what they are) this entry was checked against
    docs_per_step: bool  # `schedule.docs_per_step` exists (the RL branches); else documents per step follow from token micro-batches
    broken: tuple[
        tuple[str, str], ...
    ] = ()  # (algo.name, what happens): losses that fail at this revision, refused before the run


REVISIONS: tuple[Revision, ...] = (
    # Most specific first: `auto` takes the first one the installed Fast-LLM accepts, and main's
    # config (no `schedule`) is also accepted by the RL branches.
    Revision(
        name="gspo",
        checked_against=(
            "227f8bc1 (PR #502 `gspo` head, the branch PipelineRL's fast-llm integration targets)",
            "d3d20226 (PR #520 `jlp_rl_features`)",
        ),
        docs_per_step=True,
    ),
    Revision(
        name="main",
        checked_against=("7d61a1ba (main, 2026-07-20)",),
        docs_per_step=False,
        broken=(
            (
                "gspo",
                "its GSPO loss crashes on the first padded micro-batch (IndexError: index out of range in "
                "self; padding tokens get document index = number of documents), an upstream bug",
            ),
        ),
    ),
)

NAMES = tuple(r.name for r in REVISIONS)


def named(name: str) -> Revision:
    """The entry called `name` (not `auto`); ValueError naming the choices otherwise."""
    for revision in REVISIONS:
        if revision.name == name:
            return revision
    raise ValueError(f"unknown Fast-LLM revision {name!r}: expected {AUTO} or one of {', '.join(NAMES)}")


def candidates(version: str) -> tuple[Revision, ...]:
    """The entries preflight tries for `trainer.fast_llm.version`, in order."""
    return REVISIONS if version == AUTO else (named(version),)
