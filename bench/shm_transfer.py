"""One batch of captured states from a worker to the driver through /dev/shm, by route.

A worker process fills a batch (``--layers`` x [``--rows``, ``--hidden``] bf16, CPU
tensors: the host side of the transfer, which is what a CUDA run adds its copy to) and
hands it over with ``speccompat.inprocess.shm.to_host``; the driver maps it and copies each row
block out, as speculators 0.3.0 does (``.clone()``). Per round, in seconds:

  fresh   a new file per batch (``reuse=False``), the route before reusable slots;
  reused  the worker's slot, reused once the driver dropped the previous batch.

    python bench/shm_transfer.py [--rounds 8] [--rows 42042] [--hidden 4096] [--layers 4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import statistics
import sys
import time
from typing import Any


def worker(requests: Any, replies: Any, rows: int, hidden: int, layers: int) -> None:
    import torch

    from speccompat.inprocess import shm

    states = [torch.randn(rows, hidden).to(torch.bfloat16) for _ in range(layers)]
    while (route := requests.get()) is not None:
        start = time.perf_counter()
        out = shm.to_host(states, reuse=route == "reused")
        payload = pickle.dumps(out)
        seconds = time.perf_counter() - start
        del out
        replies.put((payload, seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rows", type=int, default=42042)  # one batch on the H200 run
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    context = mp.get_context("spawn")
    requests, replies = context.Queue(), context.Queue()
    proc = context.Process(target=worker, args=(requests, replies, args.rows, args.hidden,
                                                args.layers))
    proc.start()
    gigabytes = args.rows * args.hidden * args.layers * 2 / 1e9
    print(f"{args.layers} x [{args.rows}, {args.hidden}] bf16 = {gigabytes:.2f} GB per batch, "
          f"{args.rounds} rounds per route (first round of each route not counted)")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for route in ("fresh", "reused"):
            timings: dict[str, list[float]] = {"worker": [], "driver": [], "total": []}
            for round_ in range(args.rounds + 1):
                start = time.perf_counter()
                requests.put(route)
                payload, worker_seconds = replies.get()
                mapped = time.perf_counter()
                states = pickle.loads(payload)
                copies = [s[: args.rows // 2].clone() for s in states] + [
                    s[args.rows // 2:].clone() for s in states]
                del states
                driver_seconds = time.perf_counter() - mapped
                if round_:
                    timings["worker"].append(worker_seconds)
                    timings["driver"].append(driver_seconds)
                    timings["total"].append(time.perf_counter() - start)
                del copies
            results[route] = timings
    finally:
        requests.put(None)
        proc.join(timeout=60)
    print(f"{'route':<8} {'worker (copy in)':>17} {'driver (map, clone)':>20} {'total':>8}")
    for route, timings in results.items():
        med = {k: statistics.median(v) for k, v in timings.items()}
        print(f"{route:<8} {med['worker']:>15.3f} s {med['driver']:>18.3f} s "
              f"{med['total']:>6.3f} s")
    fresh, reused = (statistics.median(results[r]["worker"]) for r in ("fresh", "reused"))
    print(f"worker side: reused slot {fresh / reused:.1f}x faster than a fresh file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
