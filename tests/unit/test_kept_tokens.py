"""What a failed request leaves kept (`count_kept`) and a sample re-read from the journal
(`SampleState.take_journal`): each kept token is counted once. Pure, no Redis."""

from __future__ import annotations

from rlrun.actor.sampling import SampleState, count_kept
from rlrun.journal.records import SampleRecord


def held(n: int, start: int = 0) -> SampleState:
    sample = SampleState(0)
    sample.append(list(range(start, start + n)), [-0.5] * n, 1)
    return sample


def test_each_kept_token_counts_once_however_many_retries():
    sample = held(3)
    assert count_kept(sample) == 3  # the first failed request left 3 tokens
    assert count_kept(sample) == 0  # its retry found no server: nothing new was kept
    sample.append([7, 8], [-0.5] * 2, 1)
    assert count_kept(sample) == 2  # the next one broke after 2 more


def test_a_finished_sample_keeps_nothing_for_a_next_request():
    sample = held(3)
    sample.finish_reason = "stop"
    assert count_kept(sample) == 0 and sample.kept_counted == 0


def test_a_dropped_prefix_is_counted_again_only_for_the_tokens_generated_after_it():
    sample = held(4)
    count_kept(sample)
    sample.reset()  # stale: dropped, generated from the prompt again
    sample.append([9], [-0.5], 2)
    assert count_kept(sample) == 1


def test_taking_the_journals_view_keeps_the_count_of_tokens_it_still_holds():
    sample = held(5)
    count_kept(sample)
    stored = SampleRecord("run/0", 0, "finished", token_ids=[0, 1, 2], logprobs=[-0.5] * 3, versions=[1] * 3, finish_reason="stop")
    sample.take_journal(stored)
    assert (sample.completion_ids, sample.journaled, sample.finish_reason, sample.finish_recorded) == ([0, 1, 2], 3, "stop", True)
    assert sample.kept_counted == 3
    sample.take_journal(None)  # the journal holds nothing of it
    assert (sample.completion_ids, sample.journaled, sample.finish_reason, sample.kept_counted) == ([], 0, None, 0)
