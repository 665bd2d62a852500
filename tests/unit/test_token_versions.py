"""Each token's policy version, from vLLM's `weight_versions` spans (`rlrun.actor.sampling`): the
versions the staleness rule, the lag metrics and the journal read."""

from __future__ import annotations

from rlrun.actor.sampling import SampleState, token_versions
from rlrun.actor.vllm_client import VersionSpan


def test_each_token_takes_the_version_of_the_span_that_covers_it():
    spans = [VersionSpan("3", 0, 2), VersionSpan("4", 2, 5)]
    assert token_versions(spans, 5, provisional=3) == [3, 3, 4, 4, 4]


def test_weights_a_server_loaded_at_its_start_keep_the_provisional_version():
    spans = [VersionSpan("default", 0, 2), VersionSpan("7", 2, 4)]
    assert token_versions(spans, 4, provisional=6) == [6, 6, 7, 7]


def test_no_spans_or_tokens_no_span_covers_keep_the_provisional_version():
    assert token_versions(None, 3, provisional=2) == [2, 2, 2]
    assert token_versions([VersionSpan("5", 1, 9)], 3, provisional=2) == [2, 5, 5]  # a span past the end is clipped


def test_a_relabel_of_journaled_tokens_is_pending_until_the_journal_has_it():
    sample = SampleState(0)
    sample.append([1, 2, 3, 4], [-0.1] * 4, 5)
    sample.journaled = 2
    sample.relabel(0, [5, 5, 6, 6])  # only tokens not yet journaled change: nothing to rewrite
    assert sample.versions == [5, 5, 6, 6] and not sample.relabel_pending
    sample.relabel(0, [5, 6, 6, 6])  # a journaled token changes
    assert sample.versions == [5, 6, 6, 6] and sample.relabel_pending
    sample.reset()
    assert not sample.relabel_pending
