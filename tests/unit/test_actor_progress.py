"""The actor's progress line (rlrun/actor/loop.py progress_line): what a user tailing actor.log
reads every minute of a long run."""

from __future__ import annotations

from rlrun.actor.loop import progress_line

ZERO = {"groups_published": 0, "tokens_generated": 0, "request_errors": 0}


def counters(groups: int, tokens: int, errors: int = 0) -> dict[str, int]:
    return {"groups_published": groups, "tokens_generated": tokens, "request_errors": errors}


def test_it_gives_the_totals_and_the_rate_since_the_previous_line():
    line = progress_line(counters(1500, 90_000), counters(1200, 60_000), 60.0, in_flight=4, held_s=0.0)
    assert line == "1,500 groups published (+300 in 60 s), 90,000 tokens generated (500/s), 4 groups in flight"


def test_a_restarted_actor_counts_from_the_counters_it_took_over():
    # The whole-run counters came back from Redis; the rate is this process's own work.
    line = progress_line(counters(1010, 50_600), counters(1000, 50_000), 60.0, in_flight=2, held_s=0.0)
    assert "1,010 groups published (+10 in 60 s)" in line and "(10/s)" in line


def test_it_says_when_back_pressure_holds_it_and_when_requests_failed():
    line = progress_line(counters(10, 100, errors=3), counters(10, 100, errors=1), 60.0, in_flight=0, held_s=42.4)
    assert "+0 in 60 s" in line and "(0/s)" in line
    assert "held by back-pressure for 42 s" in line and "2 requests failed" in line


def test_a_healthy_line_names_no_trouble():
    line = progress_line(counters(5, 50), ZERO, 60.0, in_flight=1, held_s=0.0)
    assert "back-pressure" not in line and "failed" not in line
