"""Host time ``vllm.eagle_mixin_capture_alias`` adds to one forward, side by side in one run.

An eager Llama forward calls ``EagleModelMixin._maybe_add_hidden_state`` once for the
embeddings and once after each decoder layer (33 calls for Llama-3.1-8B's 32 layers). The
adapter puts a module-level function in front of vLLM's method: a membership test and a
call, and a copy only where the residual is ``None`` and that id is asked for. Compiled
servers trace it into the graph; eager ones pay it on every forward, on the host.

This times, with ``time.perf_counter`` over ``--runs`` forwards' worth of calls, vLLM's own
method (before ``apply``) and the adapter's (after), alternating in rounds so that drift
falls on both, with the ids [2, 16, 29, 32] (no copy: residual is never ``None`` there)
and, separately, with id 0 asked for (one copy of the embeddings per forward). The tensors
are tiny CPU tensors, so that the figures are the host's Python cost rather than the adds'
(which run on the GPU in a server); prints the medians per forward and the difference.

    python bench/capture_alias_overhead.py [--layers 32] [--runs 2000] [--rounds 7]

Needs vLLM 0.18 or newer (vLLM's CPU build does).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.eagle_mixin_capture_alias import ID


def _stack(ids: tuple[int, ...]) -> Any:
    from vllm.model_executor.models.interfaces import EagleModelMixin

    stack = EagleModelMixin()
    stack._set_aux_hidden_state_layers(ids)
    return stack


def _forward_calls(stack: Any, layers: int, embeddings: Any, state: Any, residual: Any) -> None:
    """The calls one forward makes, in Llama's order (``LlamaModel.forward``)."""
    captured: list[Any] = []
    stack._maybe_add_hidden_state(captured, 0, embeddings, None)
    for index in range(1, layers + 1):
        stack._maybe_add_hidden_state(captured, index, state, residual)


def _per_forward_us(ids: tuple[int, ...], layers: int, runs: int) -> float:
    stack = _stack(ids)
    embeddings, state, residual = (torch.zeros(8, 64) for _ in range(3))
    _forward_calls(stack, layers, embeddings, state, residual)
    start = time.perf_counter()
    for _ in range(runs):
        _forward_calls(stack, layers, embeddings, state, residual)
    return (time.perf_counter() - start) / runs * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2000, help="forwards per timing")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import vllm

    cases = {"ids [2, 16, 29, 32]": (2, 16, 29, 32), "ids [0, 16, 29, 32]": (0, 16, 29, 32)}
    samples: dict[tuple[str, str], list[float]] = {}

    def time_cases(side: str) -> None:
        for case, ids in cases.items():
            samples.setdefault((case, side), []).append(
                _per_forward_us(ids, args.layers, args.runs))

    for _ in range(args.rounds):
        time_cases("vLLM's method")
        report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
        try:
            if report.state_of(ID) is not speccompat.State.APPLIED:
                raise SystemExit(f"{ID} did not apply on vLLM {vllm.__version__}: {report}")
            time_cases("with the adapter")
        finally:
            speccompat.revert()
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}; {args.layers + 1} calls a "
          f"forward, {args.runs} forwards a timing, {args.rounds} rounds (medians, us a forward)")
    print(f"{'case':22} {'vLLM':>9} {'adapter':>9} {'added':>9}")
    for case in cases:
        plain = statistics.median(samples[(case, "vLLM's method")])
        patched = statistics.median(samples[(case, "with the adapter")])
        print(f"{case:22} {plain:9.2f} {patched:9.2f} {patched - plain:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
