"""What the zero-row guard's check (``vllm.hidden_states_connector_zero_rows``) takes from a
busy Python thread beside it, per file: the GIL time it holds, side by side with vLLM's own
write of the same file, in one run.

In an eager (``--enforce-eager``) CUDA server the engine's thread launches every kernel from
Python, while vLLM's connector writes the finished requests' files from a thread pool, where
the guard checks each file first. Whatever the check runs while holding the GIL, the engine's
thread cannot run. This measures it directly: the main thread runs small Python steps for
``--seconds`` while a second thread runs, back to back, one of

  idle    ``time.sleep(0.001)`` (the baseline: a thread that asks for the GIL and gives it up)
  nogil   ``hashlib.sha256`` of 1 MiB, which lets go of the GIL: a core's work without the
          GIL, what a busy helper costs the main thread on a machine short of cores
  check   ``zero_rows(states)``, the guard's check (no zero rows: the usual case)
  write   ``safetensors.torch.save_file`` of the file, what vLLM's connector runs anyway

and prints, per kind, the main thread's steps per second, the helper's calls, and the main
thread's time lost per helper call against ``nogil`` (the GIL's share, switch overhead
included: on a machine with a free core for the helper ``nogil`` and ``idle`` agree). Kinds
take turns over ``--rounds`` rounds; medians are printed.

    python bench/zero_guard_gil.py [--rounds 5] [--seconds 2] [--shape 1000 4 4096]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from speccompat.server.adapters.hidden_states_connector_zero_rows import zero_rows

KINDS = ("idle", "nogil", "check", "write")


def python_step() -> int:
    """A few microseconds of bytecode, as an eager forward's launch code runs."""
    total = 0
    for i in range(50):
        total += i & 7
    return total


def helper_loop(work: Callable[[], object], stop: threading.Event, calls: list[int]) -> None:
    while not stop.is_set():
        work()
        calls[0] += 1


def one_pass(work: Callable[[], object], seconds: float) -> tuple[float, int]:
    """The main thread's Python steps per second beside ``work`` run back to back in a second
    thread, and how many times ``work`` ran."""
    stop, calls = threading.Event(), [0]
    helper = threading.Thread(target=helper_loop, args=(work, stop, calls), daemon=True)
    helper.start()
    steps, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        python_step()
        steps += 1
    elapsed = time.perf_counter() - start
    stop.set()
    helper.join()
    return steps / elapsed, calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--shape", type=int, nargs=3, default=[1000, 4, 4096],
                        metavar=("TOKENS", "LAYERS", "HIDDEN"))
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    states = torch.randn(*args.shape).to(torch.bfloat16)
    tokens = torch.arange(args.shape[0])
    assert not zero_rows(states)
    block = bytes(2**20)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = str(Path(folder) / "hs.safetensors")
        work: dict[str, Callable[[], object]] = {
            "idle": lambda: time.sleep(0.001),
            "nogil": lambda: hashlib.sha256(block).digest(),
            "check": lambda: zero_rows(states),
            "write": lambda: save_file({"hidden_states": states, "token_ids": tokens}, path),
        }
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        calls: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                rate, n = one_pass(work[kind], args.seconds)
                rates[kind].append(rate)
                calls[kind].append(n / args.seconds)
    print(f"torch {torch.__version__}, shape {'x'.join(map(str, args.shape))} bf16, "
          f"{args.rounds} rounds of {args.seconds:g} s per kind, medians; "
          f"switch interval {1e3 * sys.getswitchinterval():g} ms")
    idle, nogil = statistics.median(rates["idle"]), statistics.median(rates["nogil"])
    for kind in KINDS:
        rate, per_s = statistics.median(rates[kind]), statistics.median(calls[kind])
        line = (f"  {kind:<6} main thread {rate:10.0f} steps/s ({100 * (rate / idle - 1):+6.2f} % "
                f"vs idle)  helper {per_s:9.1f} calls/s")
        if kind in ("check", "write") and per_s:
            lost = 1 - rate / nogil
            line += f"  GIL: main thread's time lost per call {1e6 * lost / per_s:9.1f} us"
        print(line)


if __name__ == "__main__":
    main()
