"""Time of ``speccompat.apply()`` once vLLM is imported (target (a): at most 20 ms).

Every run is a fresh Python process (``--python``, default this interpreter), so nothing
is cached in-process between runs. Each child first imports, untimed by the verdict:

  scenario ``vllm``       ``import torch``, ``import vllm``, then ``import speccompat``.
                          This is the README's order: apply() before the generator is
                          imported, so the speculators patches are installed as import
                          hooks and run later, when speculators' modules are imported.
  scenario ``generator``  the same, plus speculators'
                          ``data_generation.vllm_hidden_states_generator`` and
                          ``data_generation.custom_worker`` (which pull in vLLM's config,
                          scheduler, executor and request modules): every patch is
                          installed inside apply() itself.

then times ``speccompat.apply()`` and ``speccompat.revert()`` with ``time.perf_counter``.
A first, discarded run per scenario warms the file-system cache and fills a temporary
bytecode cache (``PYTHONPYCACHEPREFIX``; a pip-installed venv has its ``.pyc`` files, and
``PYTHONDONTWRITEBYTECODE=1`` would otherwise make every import compile from source;
``--no-bytecode-cache`` keeps the environment's setting). "of which detect()" is
``speccompat.detect()`` timed on its own after revert(): the version lookup apply() starts
with. The verdict is "(a) <= 20 ms" on the median apply() time of each scenario.

    python bench/apply_time.py [--runs 20] [--python PATH] [--scenario vllm|generator|both]

Exit status: 0 when every apply() returned (met or not: this is a report), 1 when an
apply() or revert() raised or an adapter reported FAILED.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from cpu_env import CPU_ENV

TARGET_MS = 20.0
MARKER = "SPECCOMPAT_BENCH_JSON "
SCENARIOS = ("vllm", "generator")
PREIMPORTS: dict[str, tuple[str, ...]] = {
    "vllm": ("torch", "vllm"),
    "generator": ("torch", "vllm", "speculators.data_generation.vllm_hidden_states_generator",
                  "speculators.data_generation.custom_worker"),
}


def child(scenario: str) -> int:
    """One measurement in this (fresh) process; prints one JSON line after MARKER."""
    import importlib
    import time

    out: dict[str, Any] = {"scenario": scenario, "preimported": list(PREIMPORTS[scenario])}
    start = time.perf_counter()
    for module in PREIMPORTS[scenario]:
        importlib.import_module(module)
    out["preimport_ms"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    import speccompat

    out["import_speccompat_ms"] = (time.perf_counter() - start) * 1e3
    before = set(sys.modules)
    start = time.perf_counter()
    try:
        report = speccompat.apply()
    except Exception as exc:  # a report of the failure, not a traceback in a child
        out["error"] = f"apply() raised {type(exc).__name__}: {exc}"
        print(MARKER + json.dumps(out), flush=True)
        return 1
    out["apply_ms"] = (time.perf_counter() - start) * 1e3
    out["modules_imported_by_apply"] = len(set(sys.modules) - before)
    out["applied"] = len(report.applied)
    out["states"] = {o.adapter: o.state.value for o in report.outcomes}
    env = report.environment
    out["versions"] = {
        "vllm": str(env.vllm.raw) if env.vllm else None,
        "vllm_dist": env.vllm.distribution if env.vllm else None,
        "speculators": str(env.speculators.raw) if env.speculators else None,
        "torch": str(sys.modules["torch"].__version__),
        "python": sys.version.split()[0],
    }
    start = time.perf_counter()
    try:
        speccompat.revert()
    except Exception as exc:
        out["error"] = f"revert() raised {type(exc).__name__}: {exc}"
        print(MARKER + json.dumps(out), flush=True)
        return 1
    out["revert_ms"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    speccompat.detect()  # apply()'s version detection alone, for the breakdown
    out["detect_ms"] = (time.perf_counter() - start) * 1e3
    failed = [a for a, s in out["states"].items() if s == "failed"]
    if failed:
        out["error"] = f"adapters FAILED: {', '.join(failed)}"
    print(MARKER + json.dumps(out), flush=True)
    return 1 if failed else 0


def run_child(python: str, scenario: str, pycache: str | None) -> dict[str, Any]:
    env = {**CPU_ENV, **os.environ}
    env.pop("SPECCOMPAT_DISABLE", None)
    if pycache:  # compiled bytecode, as a pip-installed venv has, kept outside the venv
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    proc = subprocess.run([python, os.path.abspath(__file__), "--child", scenario],
                          capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER):])
            result["rc"] = proc.returncode
            return result
    return {"scenario": scenario, "rc": proc.returncode,
            "error": f"child exited {proc.returncode} without a result: "
                     f"{proc.stderr.strip()[-2000:]}"}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def row(label: str, values: list[float]) -> str:
    return (f"  {label:<22} {statistics.median(values):>9.2f} {percentile(values, 90):>9.2f} "
            f"{min(values):>9.2f} {max(values):>9.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the venv to measure (default: this one)")
    parser.add_argument("--scenario", choices=(*SCENARIOS, "both"), default="both")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="leave PYTHONDONTWRITEBYTECODE as it is: every import compiles "
                        "from source (default: a temporary PYTHONPYCACHEPREFIX, filled by "
                        "the warm-up run)")
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    pycache = None if args.no_bytecode_cache else tempfile.mkdtemp(prefix="speccompat-pyc-")
    try:
        return measure(args, pycache)
    finally:
        if pycache:
            shutil.rmtree(pycache, ignore_errors=True)


def measure(args: argparse.Namespace, pycache: str | None) -> int:
    print(f"bytecode: {'cached in ' + pycache if pycache else 'as the environment says'} "
          f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} here)")

    scenarios = SCENARIOS if args.scenario == "both" else (args.scenario,)
    errors: list[str] = []
    verdicts: list[bool] = []
    for scenario in scenarios:
        run_child(args.python, scenario, pycache)  # warm-up, discarded
        results = []
        for i in range(args.runs):
            result = run_child(args.python, scenario, pycache)
            if "error" in result:
                errors.append(f"{scenario} run {i + 1}: {result['error']}")
            if "apply_ms" in result:
                results.append(result)
        print(f"\nscenario {scenario!r}: {len(results)} of {args.runs} fresh processes; "
              f"pre-imported: {', '.join(PREIMPORTS[scenario])}, then speccompat")
        if not results:
            print("  no measurement")
            continue
        first = results[0]
        versions = first["versions"]
        print(f"  vLLM {versions['vllm']} ({versions['vllm_dist']}), speculators "
              f"{versions['speculators']}, torch {versions['torch']}, "
              f"Python {versions['python']}")
        applied = sorted({r["applied"] for r in results})
        states = first["states"]
        catalogue = sorted({len(r["states"]) for r in results})
        print(f"  adapters applied: {'/'.join(map(str, applied))} of "
              f"{'/'.join(map(str, catalogue))} "
              f"({sum(s == 'not needed' for s in states.values())} not needed); "
              f"modules apply() imported itself: median "
              f"{statistics.median(r['modules_imported_by_apply'] for r in results):.0f}")
        print(f"  {'ms':<22} {'median':>9} {'p90':>9} {'min':>9} {'max':>9}")
        print(row("pre-imports", [r["preimport_ms"] for r in results]))
        print(row("import speccompat", [r["import_speccompat_ms"] for r in results]))
        apply_ms = [r["apply_ms"] for r in results]
        print(row("speccompat.apply()", apply_ms))
        print(row("  of which detect()", [r["detect_ms"] for r in results if "detect_ms" in r]
                  or [float("nan")]))
        print(row("speccompat.revert()",
                  [r["revert_ms"] for r in results if "revert_ms" in r] or [float("nan")]))
        met = statistics.median(apply_ms) <= TARGET_MS
        verdicts.append(met)
        print(f"  (a) apply() <= {TARGET_MS:.0f} ms (median): {'met' if met else 'NOT met'}")
    if verdicts:
        print(f"\n(a) <= {TARGET_MS:.0f} ms: {'met' if all(verdicts) else 'NOT met'} "
              f"(median apply() time, every scenario)")
    for error in errors:
        print(f"ERROR {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
