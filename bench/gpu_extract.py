"""Extraction throughput on one GPU: plain vLLM prefill, speculators 0.3.0 + speccompat, HF.

A random-weight bf16 model with Llama-3.1-8B's shapes is built locally from a config;
512 prompts of 512 to 2048 random tokens. Each measurement runs in its own process
(a clean GPU), after a warm-up batch, and prints tokens/s:

  (a) vLLM ``LLM.generate`` with ``max_tokens=1``: prefill, no capture;
  (a') the same with the engine settings of speculators 0.3.0's generator and its batches
      (``--only vllm-as-generator``: eager, at most 32 sequences and 8192 tokens a step,
      one ``generate`` per batch): what (b) would cost without any capture, so that
      (b)/(a') is the capture's cost and (a')/(a) that of the generator's settings;
  (b) speculators 0.3.0's VllmHiddenStatesGenerator after ``speccompat.apply()``,
      4 layers captured and returned on the CPU;
  (b') the same without ``speculators.generator_sample_copy`` (``--only
      speculators-copy``): speculators' own per-sample ``.clone().cpu()`` on the driver;
  (b'') (b) with the states copied to the host after the forward, not while it runs
      (``--only speculators-after``, ``SPECCOMPAT_CAPTURE_STREAM=0``);
  (a'') (b) with the capture taken out (``--only speculators-no-capture``): speculators
      0.3.0's own generator, executor, scheduler and ``generate()`` loop, the workers'
      hooks removed and the two capture calls answered in the driver with placeholder
      states of one column (nothing captured, nothing copied). (a') runs vLLM's engine
      core, which schedules the next step while the GPU computes (async scheduling, on by
      default in vLLM 0.22) with its one worker in the engine core's process; the generator
      steps synchronously (its own ``Scheduler``), sends each step to a worker process
      (``MultiprocExecutor``) and aborts each request after its step. So (a'')/(a') is
      the generator's loop and (b)/(a'') the capture alone;
  (c) HF transformers ``output_hidden_states=True``, one prompt at a time (one GPU).

``--tp 2`` runs (a) and (b) with tensor parallelism over two GPUs; (c) stays on one.

``--trace DIR``: where (b)'s time over (a') goes, on the GPU. After each vLLM kind's timed
loop, one more batch under vLLM's torch profiler (traces in DIR/<kind>, summed up as
``bench/server_extract.py --profile`` does: the GPU's busy and idle time, the DtoH copies,
the host's waiting CUDA calls), and the worker's caching-allocator counters over the timed
loop (an allocation retry frees cached blocks and synchronizes the device). The engines
then run with a profiler configured: report tokens/s from runs without ``--trace``.

(b) warms up with two batches: a batch's samples map the worker's shared-memory slot
until they are dropped, and a loop that keeps batch N while batch N+1 is made (as this
one does) alternates between two slots, made once each.

    python bench/gpu_extract.py [--prompts 512] [--tp 1] [--workdir /tmp/bench] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import timing

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                   max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5)
LAYER_IDS = [2, 16, 29, 31]  # speculators' default for 32 layers
SAMPLE_COPY = "speculators.generator_sample_copy"  # the adapter (b') goes without
MAX_MODEL_LEN = 2049
# speculators 0.3.0's VllmHiddenStatesGenerator._create_vllm_config, for (a')
GENERATOR_ENGINE: dict[str, Any] = dict(enforce_eager=True, max_num_seqs=32, block_size=16,
                                        max_num_batched_tokens=max(8192, MAX_MODEL_LEN))


def llama_8b_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**LLAMA_31_8B, bos_token_id=1, eos_token_id=2, dtype="bfloat16",
                       tie_word_embeddings=False)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer of Llama-3.1-8B's vocabulary size (prompts are token ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(int(LLAMA_31_8B["vocab_size"]))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(str(path))


def build_config_only(path: Path) -> Path:
    """Llama-3.1-8B's config and a tokenizer, no weights: for ``--load-format dummy``."""
    if not (path / "config.json").exists():
        llama_8b_config().save_pretrained(str(path))
        save_tokenizer(path)
    return path


def build_model(path: Path) -> Path:
    """Random bf16 weights with Llama-3.1-8B's shapes and a word-level tokenizer of its vocab."""
    if (path / "config.json").exists() and list(path.glob("*.safetensors")):
        return path
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama_8b_config()).to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True, max_shard_size="20GB")
    save_tokenizer(path)
    del model
    torch.cuda.empty_cache()  # the measurements run in other processes and need the memory
    return path


def make_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = LLAMA_31_8B["vocab_size"]
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(512, 2048))]
            for _ in range(count)]


# The worker's CUDA caching-allocator counters that --trace reports over a timed loop.
ALLOCATOR_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free",
                    "num_sync_all_streams")
TRACE: Path | None = None  # --trace DIR, in the child
ALLOCATOR: dict[str, int] = {}  # the counters' growth over the timed loop, worker rank 0


def allocator_counts(worker: Any) -> dict[str, int]:
    """On a worker (``collective_rpc``): its caching allocator's counters; {} off CUDA."""
    del worker
    import torch

    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {name: int(stats.get(name, 0)) for name in ALLOCATOR_COUNTS}


def profiler_settings(kind: str) -> dict[str, Any]:
    """The engine arguments that give its workers vLLM's torch profiler under --trace."""
    if TRACE is None:
        return {}
    return {"profiler_config": {"profiler": "torch", "torch_profiler_dir": str(TRACE / kind),
                                "torch_profiler_with_stack": False}}


def timed(executor: Any, loop: Any, traced_batch: Any) -> float:
    """Seconds of ``loop()``; under --trace, also the allocator counters' growth over it
    (rank 0) and one ``traced_batch()`` under the workers' profiler. ``executor``: an
    ``LLM`` or vLLM's executor (what ``collective_rpc`` takes)."""
    from speccompat.inprocess.rpc import collective_rpc

    before = collective_rpc(executor, allocator_counts, rank=0) if TRACE else {}
    start = time.perf_counter()
    loop()
    seconds = time.perf_counter() - start
    if TRACE:
        after = collective_rpc(executor, allocator_counts, rank=0)
        ALLOCATOR.update({name: after[name] - before[name] for name in after})
        collective_rpc(executor, "profile", args=(True,))
        traced_batch()
        collective_rpc(executor, "profile", args=(False,))  # the traces go to TRACE / kind
    return seconds


def prefill_engine(model: str, tp: int, **settings: Any) -> tuple[Any, Any]:
    """vLLM's ``LLM`` as (a) and (a') build it (``settings`` on top), and prefill-only
    sampling parameters."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False,
              gpu_memory_utilization=0.8, tensor_parallel_size=tp, **settings)
    return llm, SamplingParams(max_tokens=1, temperature=0.0)


def run_vllm(model: str, prompts: list[list[int]], tp: int, batch: int) -> float:
    llm, params = prefill_engine(model, tp, **profiler_settings("vllm"))
    as_inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(as_inputs[:16], params, use_tqdm=False)
    return timed(llm, lambda: llm.generate(as_inputs, params, use_tqdm=False),
                 lambda: llm.generate(as_inputs[:batch], params, use_tqdm=False))


def run_vllm_as_generator(model: str, prompts: list[list[int]], batch: int, tp: int) -> float:
    """(a'): vLLM prefill as speculators 0.3.0's generator configures it (its
    ``_create_vllm_config``: ``enforce_eager=True``, ``max_num_seqs=32``,
    ``max_num_batched_tokens=max(8192, max_model_len)``, block size 16), one ``generate``
    per batch as the generator is called, no capture."""
    llm, params = prefill_engine(model, tp, **GENERATOR_ENGINE,
                                 **profiler_settings("vllm-as-generator"))
    as_inputs = [{"prompt_token_ids": p} for p in prompts]
    for at in (0, batch):  # (b)'s warm-up: its first two batches
        llm.generate(as_inputs[at:at + batch], params, use_tqdm=False)

    def loop() -> None:
        for at in range(0, len(as_inputs), batch):
            llm.generate(as_inputs[at:at + batch], params, use_tqdm=False)

    return timed(llm, loop, lambda: llm.generate(as_inputs[:batch], params, use_tqdm=False))


GUARDS = timing.Tally()
PHASES = timing.Tally()


def time_phases(generator: Any) -> None:
    """Accumulate wall time per step of ``generate()``: the executor calls (on the real
    executor, under speccompat's views), the scheduler, and the rest (the driver's
    slicing and copying). Each executor call returns only when the workers are done."""
    executor = generator.executor.unwrapped
    timing.time_method(executor, "execute_model", PHASES,
                       "execute_model (forward + capture hooks)")
    if hasattr(executor, "sample_tokens"):
        timing.time_method(executor, "sample_tokens", PHASES, "sample_tokens")
    timing.time_method(executor, "collective_rpc", PHASES,
                       lambda a, k: f"rpc {a[0] if a else k.get('method')}")
    timing.time_method(generator.scheduler, "schedule", PHASES, "scheduler.schedule")
    timing.time_method(generator.scheduler, "finish_requests", PHASES,
                       "scheduler.finish_requests")
    timing.time_method(generator, "generate", PHASES, "generate (total)")


def transfer_costs(rows: int, hidden: int, layers: int) -> dict[str, float]:
    """Seconds to move one batch of captured states (``layers`` x [rows, hidden] bf16)
    to the driver, by route: what the capture adapter does (fresh /dev/shm file), and
    the alternatives (pageable ``.cpu()``, a pinned buffer, a reused mapping)."""
    import pickle

    import torch

    from speccompat.inprocess import shm

    states = [torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
              for _ in range(layers)]
    torch.cuda.synchronize()
    out: dict[str, float] = {}

    def clock(name: str, fn: Any) -> Any:
        start = time.perf_counter()
        value = fn()
        torch.cuda.synchronize()
        out[name] = time.perf_counter() - start
        return value

    clock("cuda cat of 4 layers (per_request + per layer)",
          lambda: [torch.cat([s[: rows // 2], s[rows // 2:]]) for s in states])
    shared = clock("D2H into a fresh /dev/shm file (shm.to_host, reuse=False)",
                   lambda: shm.to_host(states, reuse=False))
    clock("D2H into the reusable slot, first use (map, pin, copy)",
          lambda: shm.to_host(states, reuse=True))
    clock("D2H into the reusable slot, reused (what the capture adapter does)",
          lambda: shm.to_host(states, reuse=True))
    attached = clock("driver: attach the file (unpickle, map)",
                     lambda: pickle.loads(pickle.dumps(shared)))
    clock("driver: .clone() of the mapped rows (speculators)",
          lambda: [t.clone() for t in attached])
    clock("D2H pageable .cpu()", lambda: [s.cpu() for s in states])
    pinned = [torch.empty(rows, hidden, dtype=torch.bfloat16, pin_memory=True)
              for _ in range(layers)]
    clock("D2H into pinned buffers (allocated beforehand)",
          lambda: [p.copy_(s, non_blocking=True) for p, s in zip(pinned, states, strict=True)])
    reused = [torch.empty(rows, hidden, dtype=torch.bfloat16) for _ in range(layers)]
    for r in reused:
        r.fill_(0)  # pages touched once: a reused, already-faulted buffer
    clock("D2H into pageable buffers already touched",
          lambda: [r.copy_(s) for r, s in zip(reused, states, strict=True)])
    return out


def close_capture(worker: Any) -> None:
    """On a worker (``collective_rpc``): remove speccompat's capture hooks and runner wraps."""
    worker._speccompat_capture.close()


class NoCaptureExecutor:
    """(a''): the generator's executor view, with the two capture calls answered here
    (``_reset_capture`` does nothing; ``_get_captured_states`` gives ``len(LAYER_IDS)``
    placeholder tensors of one column for the batch's prompt rows) and every other call
    passed to the view."""

    def __init__(self, executor: Any) -> None:
        self.inner, self.rows = executor, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self.rows += sum(len(new.prompt_token_ids or ())
                         for new in scheduler_output.scheduled_new_reqs)
        return self.inner.execute_model(scheduler_output, *args, **kwargs)

    def collective_rpc(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        if method == "_reset_capture":
            self.rows = 0
            return [None]
        if method == "_get_captured_states":
            rows, self.rows = self.rows, 0
            return [[torch.zeros(rows, 1, dtype=torch.bfloat16) for _ in LAYER_IDS]]
        return self.inner.collective_rpc(method, *args, **kwargs)


def run_speculators(model: str, prompts: list[list[int]], batch: int, tp: int,
                    profile: bool = False, exclude: tuple[str, ...] = (),
                    kind: str = "speculators", capture: bool = True) -> float:
    import speccompat

    timing.time_guards(GUARDS)
    report = speccompat.apply(exclude=exclude)
    # Others may be "skipped": excluded here, or server-path ones (applied inside vllm serve).
    states = {o.adapter: o.state.value for o in report.outcomes}
    must_apply = {"vllm.model_forward_drift"} | ({SAMPLE_COPY} - set(exclude))
    assert all(states[a] == "applied" for a in must_apply), report
    assert not {"failed", "unsupported"} & set(states.values()), report
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    if TRACE is not None:
        from vllm.config import ProfilerConfig

        # The generator builds its own VllmConfig: its workers read the profiler's from it.
        create = VllmHiddenStatesGenerator._create_vllm_config

        def create_traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            config = create(self, *args, **kwargs)
            config.profiler_config = ProfilerConfig(**profiler_settings(kind)["profiler_config"])
            return config

        VllmHiddenStatesGenerator._create_vllm_config = create_traced  # type: ignore[method-assign]
    generator = VllmHiddenStatesGenerator(model, layer_ids=LAYER_IDS,
                                          max_model_len=MAX_MODEL_LEN,
                                          gpu_memory_utilization=0.8,
                                          tensor_parallel_size=tp)
    if not capture:
        from speccompat.inprocess.rpc import collective_rpc

        collective_rpc(generator.executor.unwrapped, close_capture)
        generator.executor = NoCaptureExecutor(generator.executor)
    warm_up = [generator.generate(prompts[at:at + batch]) for at in (0, batch)]
    del warm_up
    if profile:
        time_phases(generator)
    GUARDS.reset()

    def loop() -> None:
        for at in range(0, len(prompts), batch):
            results = generator.generate(prompts[at:at + batch])
            assert all(len(r["hidden_states"]) == len(LAYER_IDS) for r in results)

    # vLLM's executor itself: speccompat's view answers speculators' own calls in the shape
    # speculators 0.3.0 expects.
    seconds = timed(generator.executor.unwrapped, loop,
                    lambda: generator.generate(prompts[:batch]))
    generator.executor.shutdown()
    if profile:
        rows = sum(len(p) for p in prompts[:batch])
        PHASES.seconds.update({f"transfer, one batch of {rows} rows: {k}": v for k, v in
                               transfer_costs(rows, int(LLAMA_31_8B["hidden_size"]),
                                              len(LAYER_IDS)).items()})
    return seconds


def run_hf(model: str, prompts: list[list[int]]) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, device_map="cuda")
    net.eval()

    def one(prompt: list[int]) -> None:
        with torch.no_grad():
            out = net.model(input_ids=torch.tensor([prompt], device="cuda"),
                            output_hidden_states=True, use_cache=False)
            [out.hidden_states[i + 1].cpu() for i in LAYER_IDS]

    for prompt in prompts[:4]:
        one(prompt)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for prompt in prompts:
        one(prompt)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def child(kind: str, model: str, prompts_file: str, batch: int, tp: int,
          profile: bool, trace: Path | None) -> None:
    global TRACE
    TRACE = trace
    prompts = json.loads(Path(prompts_file).read_text())
    runner = {"vllm": lambda: run_vllm(model, prompts, tp, batch),
              "vllm-as-generator": lambda: run_vllm_as_generator(model, prompts, batch, tp),
              "speculators": lambda: run_speculators(model, prompts, batch, tp, profile,
                                                     kind=kind),
              "speculators-copy": lambda: run_speculators(
                  model, prompts, batch, tp, profile, exclude=(SAMPLE_COPY,), kind=kind),
              "speculators-after": lambda: run_speculators(model, prompts, batch, tp, profile,
                                                           kind=kind),
              "speculators-no-capture": lambda: run_speculators(
                  model, prompts, batch, tp, profile, kind=kind, capture=False),
              "hf": lambda: run_hf(model, prompts)}[kind]
    seconds = runner()
    print("RESULT " + json.dumps({"kind": kind, "seconds": seconds,
                                  "guard_seconds": GUARDS.seconds.get(timing.GUARDS, 0.0),
                                  "phases": PHASES.seconds,
                                  "allocator": ALLOCATOR}),
          flush=True)


def measure(kind: str, model: Path, prompts_file: Path, batch: int, tp: int,
            profile: bool = False, trace: Path | None = None) -> dict[str, Any] | None:
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if kind == "speculators-after":
        env["SPECCOMPAT_CAPTURE_STREAM"] = "0"  # the workers copy after the forward
    if trace:
        # LLM.collective_rpc sends allocator_counts, a function, through the engine core.
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--model", str(model),
                           "--prompts-file", str(prompts_file), "--batch", str(batch),
                           "--tp", str(tp),
                           *(["--profile"] if profile else []),
                           *(["--trace", str(trace)] if trace else [])],
                          env=env, capture_output=True, text=True)
    # speccompat's warnings (e.g. a shared-memory slot left pageable) explain a slow figure.
    for line in (proc.stdout + proc.stderr).splitlines():
        if "speccompat:" in line and "WARNING" in line:
            print(f"  {kind}: {line.strip()}")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    print(f"{kind} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32, help="prompts per generate() call")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size of (a), (b)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/speccompat-bench"))
    parser.add_argument("--only", nargs="*", default=["vllm", "speculators", "hf"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", action="store_true",
                        help="(b): time per step of generate(), and the transfer routes")
    parser.add_argument("--trace", type=Path, default=None, metavar="DIR",
                        help="(a), (a'), (b): one more batch under vLLM's torch profiler "
                        "(traces in DIR/<kind>) and the allocator's counters over the loop")
    parser.add_argument("--child")
    parser.add_argument("--model")
    parser.add_argument("--prompts-file")
    args = parser.parse_args()
    trace = args.trace and args.trace.resolve()  # absolute: the workers write traces there
    if args.child:
        child(args.child, args.model, args.prompts_file, args.batch, args.tp, args.profile,
              trace)
        return 0

    import torch

    args.workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = build_model(args.workdir / "llama-3.1-8b-shapes")
    print(f"model ready in {time.perf_counter() - start:.0f} s: {model}", flush=True)
    prompts = make_prompts(args.prompts)
    tokens = sum(len(p) for p in prompts)
    prompts_file = args.workdir / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    rates: dict[str, float | None] = {}
    for kind in args.only:
        result = measure(kind, model, prompts_file, args.batch, args.tp, args.profile, trace)
        seconds = result["seconds"] if result else None
        rates[kind] = tokens / seconds if seconds else None
        print(f"{kind:<17} {seconds or float('nan'):8.2f} s  "
              f"{rates[kind] or float('nan'):10.0f} tokens/s", flush=True)
        if result and seconds and kind.startswith("speculators"):
            share = 100 * result["guard_seconds"] / seconds
            print(f"guards: {result['guard_seconds'] * 1e3:.1f} ms, {share:.3f}% of (b)'s "
                  "extraction time (target <= 1%)", flush=True)
            for phase, spent in sorted(result["phases"].items()):
                print(f"  {spent:8.3f} s  {phase}", flush=True)
        if result and trace and kind != "hf":
            import vllm_traces

            counts = ", ".join(f"{name} {int(n)}" for name, n in result["allocator"].items())
            print(f"  caching allocator over the timed loop (rank 0): {counts or 'n/a'}")
            print(f"  one traced batch (traces in {trace / kind}):")
            print("\n".join(vllm_traces.summary(trace / kind))
                  or "  no trace written", flush=True)
            if steps := vllm_traces.step_table(trace / kind):  # CUDA traces only
                print("\n".join(steps), flush=True)
    a, b, c = rates.get("vllm"), rates.get("speculators"), rates.get("hf")
    a_gen = rates.get("vllm-as-generator")
    a_loop = rates.get("speculators-no-capture")
    b_copy, b_after = rates.get("speculators-copy"), rates.get("speculators-after")
    print(f"\n{len(prompts)} prompts, {tokens} tokens, {torch.cuda.get_device_name()}, "
          f"TP={args.tp} for (a) and (b)")
    print(f"(a) vLLM prefill              {a or 0:10.0f} tokens/s")
    print(f"(a') (a) as the generator runs {a_gen or 0:9.0f} tokens/s")
    print(f"(a'') the generator, no capture {a_loop or 0:8.0f} tokens/s")
    print(f"(b) speculators + speccompat  {b or 0:10.0f} tokens/s   target >= 27000")
    print(f"(b') (b) with speculators' copy {b_copy or 0:8.0f} tokens/s")
    print(f"(b'') (b), copied after the forward {b_after or 0:4.0f} tokens/s")
    print(f"(c) HF output_hidden_states   {c or 0:10.0f} tokens/s")
    if a and b:
        print(f"(b)/(a) = {b / a:.3f}   target >= 0.97 (issue #37)")
    if a and a_gen:
        print(f"(a')/(a) = {a_gen / a:.3f}   the generator's engine settings and batches")
    if a_gen and b:
        print(f"(b)/(a') = {b / a_gen:.3f}   the capture and the generator's loop")
    if a_gen and a_loop:
        print(f"(a'')/(a') = {a_loop / a_gen:.3f}   the generator's loop (synchronous steps, "
              "multiprocess executor, per-step aborts)")
    if a_loop and b:
        print(f"(b)/(a'') = {b / a_loop:.3f}   the capture alone")
    if a and b_copy:
        print(f"(b')/(a) = {b_copy / a:.3f}")
    if a and b_after:
        print(f"(b'')/(a) = {b_after / a:.3f}")
    if b and c:
        print(f"(b)/(c) = {b / c:.2f}    target >= 5")
    if args.json:
        args.json.write_text(json.dumps({"prompts": len(prompts), "tokens": tokens,
                                         "tokens_per_s": rates, "tp": args.tp,
                                         "gpu": torch.cuda.get_device_name()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
