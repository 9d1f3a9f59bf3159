"""vLLM's torch-profiler traces, summed up for ``bench/server_extract.py --profile`` and
``bench/gpu_extract.py --trace``: where an extraction pass's time goes on the GPU and on the
host (``summary``), and step by step (``step_table``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals (kernels of several streams
    overlap)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


# The host's CUDA calls that wait (or may: a pageable copy, a pinned allocation).
WAITING_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                 "cudaMemcpyAsync", "cudaMemcpy", "cudaHostAlloc", "cudaFreeHost",
                 "cudaStreamWaitEvent")


def traces(folder: Path) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """Each torch-profiler trace under ``folder`` and its complete events (those with a
    duration)."""
    for path in sorted(folder.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as stream:
            yield path, [e for e in json.load(stream).get("traceEvents", [])
                         if e.get("ph") == "X" and "dur" in e]


def summary(folder: Path) -> list[str]:
    """Per torch-profiler trace under ``folder`` (one per process that profiled): the span
    of its events, the GPU's busy time (the union of its kernels) and idle time in that
    span, the DtoH copies, and the host's waiting CUDA calls (count, total)."""
    lines = []
    for path, events in traces(folder):
        if not events:
            continue
        span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e6
        kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
        line = f"  {path.name[:60]}: span {span:.2f} s"
        if kernels:
            busy = busy_seconds(kernels) / 1e6
            line += f", GPU busy {busy:.2f} s, idle {span - busy:.2f} s"
        dtoh = [e["dur"] for e in events
                if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
        if dtoh:
            line += f", DtoH copies {len(dtoh)} x, {sum(dtoh) / 1e6:.3f} s"
        calls: dict[str, list[float]] = {}
        for event in events:
            if event.get("cat") in ("cuda_runtime", "cuda_driver") \
                    and event.get("name") in WAITING_CALLS:
                calls.setdefault(event["name"], []).append(event["dur"])
        waits = sorted(calls.items(), key=lambda item: -sum(item[1]))
        line += "".join(f"; {call} {len(durs)} x {sum(durs) / 1e6:.3f} s"
                        for call, durs in waits)
        lines.append(line)
    return lines


def step_table(folder: Path) -> list[str]:
    """Per model step of each worker trace under ``folder`` (vLLM's ``execute_context_*``
    annotations on the GPU's timeline): its tokens, its span on the GPU, the sum of its
    kernels, its device-to-host copies beside it (count, ms) and the GPU's wait before the
    next step: where a batch's time goes between the kernels."""
    lines = []
    for path, events in traces(folder):
        steps = sorted((e for e in events if e.get("cat") == "gpu_user_annotation"
                        and e.get("name", "").startswith("execute_context")),
                       key=lambda e: e["ts"])
        # A step's annotation can be split in pieces; keep the longest per start.
        steps = [e for e in steps if not any(o is not e and o["ts"] <= e["ts"]
                                             and o["ts"] + o["dur"] >= e["ts"] + e["dur"]
                                             for o in steps)]
        if not steps:
            continue
        kernels = [e for e in events if e.get("cat") == "kernel"]
        copies = [e for e in events
                  if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
        lines.append(f"  {path.name[:60]}: {len(steps)} steps")
        lines.append("    tokens   GPU ms  kernels ms  DtoH (n, ms)  to next ms  idle ms")
        for index, step in enumerate(steps):
            start, end = step["ts"], step["ts"] + step["dur"]
            inside = [k["dur"] for k in kernels if start <= k["ts"] < end]
            beside = [c["dur"] for c in copies if start <= c["ts"] < end]
            tokens = step["name"].split("(", 1)[1].split(")", 1)[0] if "(" in step["name"] else "?"
            line = (f"    {tokens:>6} {step['dur'] / 1e3:8.1f} {sum(inside) / 1e3:11.1f} "
                    f"{len(beside):5d} {sum(beside) / 1e3:6.1f}")
            if index + 1 < len(steps):
                # Between two steps: the sampler's kernels, and the GPU waiting for the host.
                following = steps[index + 1]["ts"]
                between = [(max(k["ts"], end), min(k["ts"] + k["dur"], following))
                           for k in kernels if k["ts"] < following and k["ts"] + k["dur"] > end]
                idle = following - end - busy_seconds(between)
                line += f"  {(following - end) / 1e3:10.2f} {idle / 1e3:8.2f}"
            lines.append(line)
    return lines
