"""Cost of the zero-row guard (``vllm.hidden_states_connector_zero_rows``) per hidden-states
file, next to the cost of writing that file, side by side in one run.

For each shape (tokens x layer ids x hidden, bf16 by default) this times, with
``time.perf_counter`` over ``--runs`` repeats after one warm-up, each in its own loop:

  check   ``zero_rows(states)``: what the guard runs before every write (no zero rows: the
          usual case; it reads each row's first values only, through NumPy on CPU tensors)
  torch   the same check in torch's own ops (the guard's way before 2026-12-06, and still
          on other devices), which enter torch's intra-op thread pool
  write   ``safetensors.torch.save_file`` of ``{hidden_states, token_ids}`` to ``--dir``
          (default: a temporary folder), what vLLM's connector runs
  full    the same check on a file with one zero row per 100 tokens (the guard then reads
          those rows in full before refusing)

and prints the medians and check / write in percent.

    python bench/zero_guard.py [--runs 20] [--dtype bfloat16] [--dir PATH] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from speccompat.server.adapters.hidden_states_connector_zero_rows import (
    _zero_rows_in_torch,
    zero_rows,
)

SHAPES = ((1000, 4, 4096), (4000, 4, 4096), (8000, 4, 7168), (300, 3, 2048))


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _times(work: Callable[[], object], runs: int) -> list[float]:
    """``runs`` wall times of ``work`` after one warm-up call."""
    work()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def run(shape: tuple[int, int, int], dtype: torch.dtype, runs: int, folder: Path) -> str:
    states = torch.randn(*shape).to(dtype)
    tokens = torch.arange(shape[0])
    holed = states.clone()
    holed[::100, 1] = 0
    path = folder / "hs.safetensors"
    # Each kind in its own loop: timed right after a write, the check measured the kernel's
    # page-cache writeback (a 1.5-42% spread on a loaded 2-core machine), not itself.
    found, holes = zero_rows(states), zero_rows(holed)
    assert not found and holes == {1: len(range(0, shape[0], 100))}
    assert _zero_rows_in_torch(states) == found and _zero_rows_in_torch(holed) == holes
    checks = _times(lambda: zero_rows(states), runs)
    torch_checks = _times(lambda: _zero_rows_in_torch(states), runs)
    writes = _times(lambda: save_file({"hidden_states": states, "token_ids": tokens},
                                      str(path)), runs)
    fulls = _times(lambda: zero_rows(holed), runs)
    check, write, full = _median_ms(checks), _median_ms(writes), _median_ms(fulls)
    in_torch = _median_ms(torch_checks)
    size = states.numel() * states.element_size() / 2**20
    name = "x".join(map(str, shape))
    return (f"{name:>16} {size:8.1f} MiB  check {check:8.3f} ms  torch {in_torch:8.3f} ms  "
            f"write {write:8.2f} ms  check/write {100 * check / write:6.2f} %  "
            f"(zero rows found: {full:7.3f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (default: torch's; the torch column's "
                        "kernels use them); on a busy machine a two-thread kernel can wait a "
                        "scheduler slice for the busy core")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"medians of {args.runs} runs")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for shape in SHAPES:
            print(run(shape, dtype, args.runs, Path(folder)))


if __name__ == "__main__":
    main()
