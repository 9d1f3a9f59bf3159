"""``bench/vllm_traces.py``'s reading of a trace taken with ``torch_profiler_with_stack``: the
GPU's idle gaps and what the host's Python threads ran in them (issue #37's eager profile)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TRACES = Path(__file__).resolve().parents[2] / "bench" / "vllm_traces.py"


@pytest.fixture(scope="module")
def traces() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_traces_bench", TRACES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel(ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "tid": 7}


def frame(tid: int, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_gaps_are_the_idle_stretches_between_overlapping_kernels(traces: ModuleType) -> None:
    # two streams overlap (0-10 and 5-20), then 30 us idle, then 5 us, then the end
    kernels = [(0.0, 10.0), (5.0, 20.0), (50.0, 60.0), (65.0, 70.0)]
    assert traces.idle_gaps(kernels, 20.0) == [(20.0, 50.0)]
    assert traces.idle_gaps(kernels, 5.0) == [(20.0, 50.0), (60.0, 65.0)]


def test_innermost_frames_carry_their_callers_and_lose_addresses(traces: ModuleType) -> None:
    events = [
        frame(1, "core.py(10): run_busy_loop", 0, 100),
        frame(1, "core.py(20): _process_input_queue", 0, 60),
        frame(1, "<built-in method get of _queue.SimpleQueue object at 0x7f00ab>", 1, 58),
        frame(1, "core.py(30): step", 60, 40),
        frame(2, "thread.py(5): _worker", 0, 100),
    ]
    leaves = [(f["name"], caller) for f, caller in traces.leaf_frames(events)]
    assert leaves == [
        ("<built-in method get of _queue.SimpleQueue object at 0x7f00ab>",
         "core.py(20): _process_input_queue"),
        ("core.py(30): step", "core.py(10): run_busy_loop"),
        ("thread.py(5): _worker", ""),
    ]


def test_host_in_gaps_sums_each_threads_frames_over_the_gaps_only(
        traces: ModuleType, tmp_path: Path) -> None:
    ms = 1000.0  # trace times are in microseconds
    events = [
        kernel(0, 10 * ms), kernel(40 * ms, 10 * ms), kernel(55 * ms, 10 * ms),
        # the GPU idles 10-40 ms (30 ms) and 50-55 ms (5 ms, under the 20-ms floor)
        frame(1, "core.py(20): _process_input_queue", 0, 65 * ms),
        frame(1, "<built-in method get of _queue.SimpleQueue object at 0x1>", 5 * ms, 30 * ms),
        frame(2, "safetensors/torch.py(1): save_file", 30 * ms, 25 * ms),
        {"ph": "M", "name": "thread_name", "tid": 1},  # metadata, no duration
    ]
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as stream:
        json.dump({"traceEvents": events}, stream)

    lines = traces.host_in_gaps(tmp_path, min_gap_ms=20.0)

    assert lines[0].endswith("1 GPU gaps >= 20 ms, 0.030 s; the host's innermost Python "
                             "frames in them:")
    # the queue's get overlaps the gap 10-35 ms (25 ms), the write 30-40 ms (10 ms); the
    # write's 50-55 ms fall in the short gap, which is not counted
    assert lines[1:] == [
        "    thread 1:   0.025 s  core.py(20): _process_input_queue > "
        "<built-in method get of _queue.SimpleQueue object>",
        "    thread 2:   0.010 s  safetensors/torch.py(1): save_file",
    ]


def test_traces_without_python_frames_print_nothing(traces: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "rank0.pt.trace.json").write_text(
        json.dumps({"traceEvents": [kernel(0, 10), kernel(100, 10)]}))
    assert traces.host_in_gaps(tmp_path, min_gap_ms=0.01) == []
