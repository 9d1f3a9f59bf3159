"""vLLM's torch-profiler traces, summed up for ``bench/server_extract.py --profile`` and
``bench/gpu_extract.py --trace``: where an extraction pass's time goes on the GPU and on the
host (``summary``), step by step (``step_table``), and what the host's Python threads did while
the GPU sat idle (``host_in_gaps``, traces taken with ``torch_profiler_with_stack``)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as disjoint intervals in order (kernels of
    several streams overlap)."""
    union: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Time covered by the union of ``(start, end)`` intervals."""
    return sum(end - start for start, end in merged(intervals))


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


def idle_gaps(kernels: list[tuple[float, float]], min_gap: float) -> list[tuple[float, float]]:
    """The GPU's idle stretches of at least ``min_gap`` between the first kernel's start and
    the last kernel's end (``kernels``: ``(start, end)`` of every stream)."""
    return [(before[1], after[0]) for before, after in pairwise(merged(kernels))
            if after[0] - before[1] >= min_gap]


def leaf_frames(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """The Python frames (``python_function`` events) that called no other traced frame on
    their thread, each with its caller's name: where each thread's time went, a stack's
    innermost frame (a built-in's caller says whose call it was)."""
    frames = sorted((e for e in events if e.get("cat") == "python_function"),
                    key=lambda e: (str(e.get("tid")), e["ts"], -e["dur"]))
    leaves = []
    stack: list[dict[str, Any]] = []
    for index, frame in enumerate(frames):
        while stack and (stack[-1].get("tid") != frame.get("tid")
                         or stack[-1]["ts"] + stack[-1]["dur"] <= frame["ts"]):
            stack.pop()
        following = frames[index + 1] if index + 1 < len(frames) else None
        called = (following is not None and following.get("tid") == frame.get("tid")
                  and following["ts"] < frame["ts"] + frame["dur"])
        if not called:
            leaves.append((frame, frame_name(stack[-1]) if stack else ""))
        stack.append(frame)
    return leaves


def frame_name(frame: dict[str, Any]) -> str:
    """A frame's name without the object addresses that built-ins' names carry."""
    return re.sub(r" at 0x[0-9a-f]+", "", str(frame.get("name", "?")))


def host_in_gaps(folder: Path, min_gap_ms: float = 20.0, top: int = 8) -> list[str]:
    """Per trace with kernels and Python frames under ``folder``: the GPU's idle gaps of at
    least ``min_gap_ms`` and, summed over them, the time each thread spent in each innermost
    Python frame (the ``top`` largest): whether the host was busy (a frame of vLLM's or the
    connector's) or waiting for work (a poll, a queue's get) while the GPU idled."""
    lines = []
    for path, events in traces(folder):
        kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
        leaves = leaf_frames(events)
        if not kernels or not leaves:
            continue
        gaps = idle_gaps(kernels, min_gap_ms * 1e3)
        total = sum(end - start for start, end in gaps)
        lines.append(f"  {path.name[:60]}: {len(gaps)} GPU gaps >= {min_gap_ms:g} ms, "
                     f"{total / 1e6:.3f} s; the host's innermost Python frames in them:")
        spent: dict[tuple[Any, str], float] = {}
        for frame, caller in leaves:
            start, end = frame["ts"], frame["ts"] + frame["dur"]
            inside = sum(max(0.0, min(end, gap_end) - max(start, gap_start))
                         for gap_start, gap_end in gaps)
            if inside > 0:
                name = frame_name(frame)
                if name.startswith("<built-in") and caller:
                    name = f"{caller} > {name}"
                key = (frame.get("tid"), name)
                spent[key] = spent.get(key, 0.0) + inside
        for (tid, name), seconds in sorted(spent.items(), key=lambda item: -item[1])[:top]:
            lines.append(f"    thread {tid}: {seconds / 1e6:7.3f} s  {name[-110:]}")
    return lines
