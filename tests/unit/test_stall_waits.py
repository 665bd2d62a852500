"""What a stalled run's report says the hf trainer waits for (rlrun/parts/progress.py
`trainer_wait`, from its state hash as read): a weight update in flight is named first, with its
version and how long it has lasted; otherwise what the trainer's heartbeat says."""

from __future__ import annotations

import time

from rlrun.parts.progress import trainer_wait
from rlrun.streams import names

NOW = 1_800_000_000.0


def test_a_stuck_update_is_named_with_its_version_and_how_long_it_has_lasted():
    state = {names.UPDATING_WEIGHTS_TO: "18", names.UPDATING_WEIGHTS_SINCE: str(NOW - 95.4), "waiting_for": ""}
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW - 95.4))
    assert trainer_wait(state, NOW) == f"its weight update to policy version 18, in progress for 95 s (since {since})"


def test_what_the_heartbeat_says_follows_the_update():
    state = {names.UPDATING_WEIGHTS_TO: "18", names.UPDATING_WEIGHTS_SINCE: str(NOW - 3), "waiting_for": "a vLLM server for the weight update (refused)"}
    assert trainer_wait(state, NOW).endswith("in progress for 3 s (since %s); a vLLM server for the weight update (refused)"
                                             % time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW - 3)))  # fmt: skip


def test_without_an_update_the_heartbeat_says_it():
    assert trainer_wait({"waiting_for": "groups (0 of 2 for step 18)"}, NOW) == "groups (0 of 2 for step 18)"
    assert trainer_wait({}, NOW) == "nothing it says (in a step, or a trainer that does not say)"
    assert trainer_wait({names.UPDATING_WEIGHTS_TO: "18"}, NOW) == "nothing it says (in a step, or a trainer that does not say)"  # half-written: not an update
