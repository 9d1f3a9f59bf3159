"""Share of extraction time spent in speccompat's guards (target: at most 1%).

Runs speculators' generator after ``speccompat.apply()`` on a tiny local model (vLLM's
CPU build works) and accumulates the wall time of every guard call: the executor
view's bookkeeping of each step and the structure check of each batch.

    python bench/guard_overhead.py [--batches 20] [--batch 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import timing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
# tiny_models: the test suite's tiny checkpoints
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import cpu_env

cpu_env.set_defaults()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    import speccompat
    import tiny_models

    tally = timing.Tally()
    timing.time_guards(tally)

    workdir = Path(tempfile.mkdtemp(prefix="speccompat-guards-"))
    model = tiny_models.build_llama(workdir / "llama")
    speccompat.apply(strict=True)
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    generator = VllmHiddenStatesGenerator(str(model), layer_ids=[0, 1, 2, 3], max_model_len=2048)
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE,
                                       [64 + (37 * i) % 900 for i in range(args.batch)])
    generator.generate(prompts)  # warm-up
    tally.reset()
    start = time.perf_counter()
    tokens = 0
    for _ in range(args.batches):
        results = generator.generate(prompts)
        tokens += sum(r["input_ids"].numel() for r in results)
    total = time.perf_counter() - start
    generator.executor.shutdown()
    print(f"{args.batches} batches of {args.batch} prompts, {tokens} tokens, {total:.2f} s "
          f"({tokens / total:.0f} tokens/s)")
    spent = tally.seconds.get(timing.GUARDS, 0.0)
    print(f"guards: {tally.calls.get(timing.GUARDS, 0)} calls, {spent * 1e3:.2f} ms, "
          f"{100 * spent / total:.3f}% of extraction time (target <= 1%)")
    return 0 if spent <= 0.01 * total else 1


if __name__ == "__main__":
    sys.exit(main())
