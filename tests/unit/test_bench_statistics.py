"""The interval ``bench/server_extract.py`` prints beside a median of paired ratios (docs
quote it for issue #37's "within 1% on the medians")."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "server_extract.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("server_extract_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the bench puts tests/ and tools/ first; leave the path as it was
    yield module
    del sys.modules[spec.name]


def sign_test_coverage(n: int, k: int) -> float:
    """P(the k-th smallest <= median <= the k-th largest) for n draws of a continuous law."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", [6, 7, 10, 12, 26, 40])
def test_median_interval_is_the_narrowest_sign_test_interval_of_95_percent(
        bench: ModuleType, n: int) -> None:
    values = [float(v) for v in range(n)]  # the i-th smallest is i
    low, high = bench.median_interval(values[::-1])
    k = int(low) + 1
    assert high == n - k
    assert sign_test_coverage(n, k) >= 0.95
    assert sign_test_coverage(n, k + 1) < 0.95


def test_fewer_than_six_rounds_give_no_median_interval(bench: ModuleType) -> None:
    assert bench.median_interval([1.0, 0.99, 1.01, 1.0, 0.98]) is None


def test_one_disturbed_round_moves_the_median_interval_by_one_value_at_most(
        bench: ModuleType) -> None:
    ratios = [1.0 + 0.002 * (i % 5 - 2) for i in range(20)]
    quiet = bench.median_interval(ratios)
    disturbed = bench.median_interval([*ratios[:-1], 0.85])
    assert quiet is not None and disturbed is not None
    assert disturbed[0] >= 0.996 and disturbed[1] <= quiet[1]
    line = bench.ratio_line("speccompat vs stock", ratios)
    assert "median 1.0000 (95%: 0.9980..1.0020)" in line


@pytest.mark.parametrize(("log", "tokens"), [
    # vLLM 0.32.0's one line (kv_cache_utils.update_kv_cache_capacity), engine prefix and all
    ("(EngineCore pid=2199) INFO 12-07 22:21:40 [kv_cache_utils.py:1314] GPU KV cache size: "
     "40,960 tokens, Maximum concurrency for 1,024 tokens per request: 40.00x\n", 40960),
    # the CPU build's, and a release that logged the size on a line of its own
    ("INFO [kv_cache_utils.py:1087] CPU KV cache size: 8,192 tokens, Maximum concurrency", 8192),
    ("INFO GPU KV cache size: 123456 tokens\nINFO Maximum concurrency for 2048 tokens", 123456),
    ("INFO a server log without the line", None),
])
def test_kv_cache_tokens_reads_the_engine_start_up_line(bench: ModuleType, log: str,
                                                        tokens: int | None) -> None:
    assert bench.kv_cache_tokens(log) == tokens
