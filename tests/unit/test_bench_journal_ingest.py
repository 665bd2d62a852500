"""bench/journal_ingest.py's pure parts: percentiles, shapes, and the fleet projection."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "journal_ingest.py"


@pytest.fixture(scope="module")
def ingest():
    spec = importlib.util.spec_from_file_location("bench_journal_ingest", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_journal_ingest"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_journal_ingest", None)


def test_percentiles_interpolate_between_ranks(ingest):
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert ingest.percentile(values, 50) == 3.0
    assert ingest.percentile(values, 0) == 1.0 and ingest.percentile(values, 100) == 5.0
    assert ingest.percentile(values, 99) == pytest.approx(4.96)
    assert ingest.percentile([1.0, 2.0], 50) == 1.5
    assert math.isnan(ingest.percentile([], 50))
    with pytest.raises(ValueError, match="0..100"):
        ingest.percentile(values, 101)


def test_shapes_are_parsed_and_bad_ones_named(ingest):
    assert ingest.parse_shapes("16x8, 64x64") == [(16, 8), (64, 64)]
    for bad in ("16", "0x8", "ax8", "16x"):
        with pytest.raises(ValueError, match="FLUSHxBATCH"):
            ingest.parse_shapes(bad)


def test_the_fleet_projection(ingest):
    p = ingest.project(
        **ingest.TARGET, cpu_s_per_million_tokens=1.0, cpu_budget_per_shard=0.5, flush_tokens=16, samples_per_call=8
    )
    assert p.sequences == 64 * 8 * 256 == 131_072
    assert p.tokens_per_s == 6_553_600
    assert p.shards == 14  # 0.5 core / 1 CPU s per M tokens = 500k tokens/s a shard: 13.1 -> 14
    assert p.tokens_per_s_per_shard == pytest.approx(6_553_600 / 14)
    assert p.tokens_per_call == 128 and p.calls_per_s == pytest.approx(51_200)
    assert p.calls_per_s_per_shard == pytest.approx(51_200 / 14)
    assert p.flush_interval_s == pytest.approx(0.32)
    cheaper = ingest.project(
        **ingest.TARGET, cpu_s_per_million_tokens=0.25, cpu_budget_per_shard=0.5, flush_tokens=64, samples_per_call=64
    )
    assert cheaper.shards == 4 and cheaper.calls_per_s == pytest.approx(1600)
    with pytest.raises(ValueError, match="positive"):
        ingest.project(**ingest.TARGET, cpu_s_per_million_tokens=0, cpu_budget_per_shard=0.5, flush_tokens=1, samples_per_call=1)
