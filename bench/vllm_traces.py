"""vLLM's torch-profiler traces, summed up for ``bench/server_extract.py --profile``: where an
extraction pass's time goes on the GPU and on the host."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


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


def summary(folder: Path) -> list[str]:
    """Per torch-profiler trace under ``folder`` (one per process that profiled): the span
    of its events, the GPU's busy time (the union of its kernels) and idle time in that
    span, the DtoH copies, and the host's waiting CUDA calls (count, total)."""
    lines = []
    for path in sorted(folder.rglob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as stream:
            events = [e for e in json.load(stream).get("traceEvents", [])
                      if e.get("ph") == "X" and "dur" in e]
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
