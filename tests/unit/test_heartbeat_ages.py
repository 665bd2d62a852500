"""A heartbeat's age on the supervisor's own clock (rlrun/parts/role_parts.py HeartbeatAges): a
child on another node stamps its heartbeat with that node's clock, and a skew must read neither as
silence nor as life."""

from __future__ import annotations

from rlrun.parts.role_parts import HEARTBEAT_FRESH_S, HeartbeatAges

BEAT = ("rlrun:actor:state", "heartbeat", 4242)


class Clocks:
    """The supervisor's monotonic and wall clocks, moved by the test."""

    def __init__(self, wall: float = 1_000_000.0) -> None:
        self.mono, self.wall = 50.0, wall

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def ages(self) -> HeartbeatAges:
        return HeartbeatAges(clock=lambda: self.mono, wall_clock=lambda: self.wall)


def beating(clocks: Clocks, ages: HeartbeatAges, skew_s: float, seconds: int) -> list[float]:
    """A child whose clock is `skew_s` off ours beats every second; the ages we read each time."""
    seen = []
    for _ in range(seconds):
        clocks.tick(1.0)
        seen.append(ages.age_s(BEAT, clocks.wall + skew_s))
    return seen


def test_a_child_whose_clock_is_behind_ours_is_fresh_once_its_heartbeat_moves():
    clocks = Clocks()
    ages = clocks.ages()
    seen = beating(clocks, ages, skew_s=-30.0, seconds=5)
    assert seen[0] >= 30.0  # first sight: aged by the clocks, all there is to go on
    assert seen[1:] == [0.0, 0.0, 0.0, 0.0]  # then each change is a sign of life, whatever its stamp


def test_a_child_whose_clock_is_ahead_is_silent_once_its_heartbeat_stops():
    clocks = Clocks()
    ages = clocks.ages()
    assert beating(clocks, ages, skew_s=+30.0, seconds=3) == [0.0, 0.0, 0.0]
    last = clocks.wall + 30.0  # it froze: the stamp never changes again, however far ahead it is
    clocks.tick(HEARTBEAT_FRESH_S + 1)
    assert ages.age_s(BEAT, last) == HEARTBEAT_FRESH_S + 1


def test_on_one_clock_a_stale_heartbeat_is_as_old_as_its_stamp():
    clocks = Clocks()
    ages = clocks.ages()
    stamp = clocks.wall - 2.0
    assert ages.age_s(BEAT, stamp) == 2.0
    clocks.tick(4.0)
    assert ages.age_s(BEAT, stamp) == 6.0  # it has not moved since


def test_a_heartbeat_never_written_is_never_fresh():
    clocks = Clocks()
    ages = clocks.ages()
    for _ in range(3):
        clocks.tick(1.0)
        assert ages.age_s(BEAT, 0.0) > HEARTBEAT_FRESH_S


def test_each_process_is_aged_on_its_own():
    clocks = Clocks()
    ages = clocks.ages()
    assert ages.age_s(BEAT, clocks.wall) == 0.0
    restarted = (*BEAT[:2], 4343)  # a new pid writes the same field: not the old process's change
    clocks.tick(10.0)
    assert ages.age_s(restarted, clocks.wall - 10.0) == 10.0
