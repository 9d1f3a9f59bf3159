"""How fast speculators' own ``generate-offline-data`` can go when the server costs nothing:
its start-up, and its per-file work (the move out of ``shared_storage_path``,
``--validate-outputs``' read-back), apart from vLLM's prefill.

A diagnostic, not a server-path test: a stand-in endpoint (stdlib HTTP, its own process)
answers ``/v1/models`` and ``/v1/completions`` as vLLM's ``extract_hidden_states`` server
does (``choices[0].prompt_token_ids``, ``kv_transfer_params.hidden_states_path``), and
"writes" each file by hard-linking one safetensors file made up front (every prompt is the
same token sequence, so one file fits them all). speculators' CLI is the real one.

    python bench/cli_ceiling.py --prompt-len 1000 --hidden 4096 --layers 4 \
        --sizes 16 512 --variants validate no-validate validate-other-fs

Prints first what the openai SDK's request building costs the CLI's one event loop per
prompt (``async_maybe_transform`` of the completion parameters walks every token id of the
prompt), then, per variant, the CLI's seconds at each size and, from two sizes, its steady
state in files/s and prompt tokens/s (the ceiling a server's prefill would have to stay under
for the CLI not to be the limit) and its start-up (the small run less its files at that rate).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from server_extract import (  # noqa: E402
    CLI_VARIANTS,
    run_cli,
    steady_state,
    steady_state_caveat,
)

MODEL = "stand-in"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4, help="slots per file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=list(CLI_VARIANTS),
                        choices=list(CLI_VARIANTS))
    parser.add_argument("--workdir", type=Path, help="default: a new folder under /tmp")
    parser.add_argument("--other-fs", type=Path, default=Path("/dev/shm"))
    return parser.parse_args(argv)


def make_template(path: Path, tokens: list[int], layers: int, hidden: int) -> None:
    import torch
    from safetensors.torch import save_file

    states = torch.randn(len(tokens), layers, hidden).to(torch.bfloat16)
    save_file({"hidden_states": states, "token_ids": torch.tensor(tokens)}, str(path))


def serve(port_out: Any, template: str, storage: str, tokens: list[int]) -> None:
    """The stand-in endpoint (a child process): each completion links the template into
    ``storage`` under a new name and answers with its path."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer({"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}]})

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if request.get("prompt") != tokens:
                self.send_error(400, "every prompt of this bench is the template's tokens")
                return
            path = os.path.join(storage, f"{uuid.uuid4().hex}.safetensors")
            os.link(template, path)
            self._answer({
                "id": uuid.uuid4().hex, "object": "text_completion", "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "text": "", "finish_reason": "length",
                             "logprobs": None, "prompt_token_ids": tokens}],
                "usage": {"prompt_tokens": len(tokens), "completion_tokens": 1,
                          "total_tokens": len(tokens) + 1},
                "kv_transfer_params": {"hidden_states_path": path}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def request_transform_ms(prompt_len: int, calls: int = 50) -> float:
    """Milliseconds the openai SDK takes to build one completion request's body for a
    ``prompt_len``-token prompt, as speculators' client sends it (``prompt=`` token ids)."""
    import asyncio

    from openai._utils import async_maybe_transform
    from openai.types import completion_create_params

    params = {"model": MODEL, "prompt": list(range(prompt_len)), "max_tokens": 1}
    kind = completion_create_params.CompletionCreateParamsNonStreaming

    async def timed() -> float:
        await async_maybe_transform(params, kind)
        started = time.perf_counter()
        for _ in range(calls):
            await async_maybe_transform(params, kind)
        return (time.perf_counter() - started) / calls * 1e3

    return asyncio.run(timed())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import tiny_models

    work = args.workdir or Path(tempfile.mkdtemp(prefix="cli-ceiling-"))
    storage = work / "hs"
    storage.mkdir(parents=True, exist_ok=True)
    tokens = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [args.prompt_len], seed=3)[0]
    template = work / "template.safetensors"
    make_template(template, tokens, args.layers, args.hidden)
    size_mb = template.stat().st_size / 1e6
    queue: Any = multiprocessing.get_context("spawn").Queue()
    endpoint = multiprocessing.get_context("spawn").Process(
        target=serve, args=(queue, str(template), str(storage), tokens), daemon=True)
    endpoint.start()
    url = f"http://127.0.0.1:{queue.get(timeout=60)}"
    print(f"cli_ceiling: {args.prompt_len} tokens x {args.layers} slots x {args.hidden} bf16 "
          f"= {size_mb:.1f} MB per file, concurrency {args.concurrency}, workdir {work}, "
          f"other filesystem {args.other_fs}; {os.cpu_count()} CPUs", flush=True)
    import openai

    transform = request_transform_ms(args.prompt_len)
    print(f"openai {openai.__version__} request building: {transform:.2f} ms per "
          f"{args.prompt_len}-token prompt, one event loop: at most "
          f"{args.prompt_len / transform * 1e3:.0f} prompt tok/s for that alone", flush=True)
    try:
        for variant in args.variants:
            validate, other = CLI_VARIANTS[variant]
            out = (args.other_fs if other else work) / f"cli-ceiling-out-{os.getpid()}"
            seconds = [run_cli(url, [tokens] * n, args.concurrency, work, validate=validate,
                               out=out) for n in args.sizes]
            line = f"{variant:<18} " + " ".join(
                f"{n}: {s:.2f} s" for n, s in zip(args.sizes, seconds, strict=True))
            if steady := steady_state(args.sizes, seconds):
                rate, startup = steady
                line += (f"; steady state {rate:.1f} files/s = {rate * args.prompt_len:.0f} "
                         f"tok/s ({rate * size_mb / 1e3:.2f} GB/s); start-up {startup:.1f} s"
                         + steady_state_caveat(seconds))
            print(line, flush=True)
    finally:
        endpoint.terminate()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
