"""What the copies of vLLM's own extraction tests (tests/upstream/vllm_v<X>/) take from here
instead of from vLLM's test tree, each standing in for one thing the offline CPU machine
lacks.

- :func:`create_new_process_for_each_test` and :func:`multi_gpu_test`: the decorators of
  the same names in vLLM's ``tests/utils.py``, which cannot be imported here (2,400 lines
  importing openai, anthropic, httpx and vLLM's GPU test helpers). The first runs the test
  in a fresh interpreter, as vLLM's own ``spawn_new_process_for_each_test`` does (the test
  function found again by module and name): vLLM's picks ``fork`` on CPU, but a forked
  pytest process that has run torch and vLLM deadlocked here (measured on vLLM 0.32.0: the
  forked child waited on a futex while its engine sat idle, 15 minutes), as
  tools/cpu_env.py says of forking on CPU. A skip, a failure or an error in the child is
  raised again in the parent, with the child's own exception where it pickles. The second
  is vLLM's two-device test: on this machine the tensor-parallel ranks are CPU processes,
  so it asks for that many CPU cores instead of GPUs. :func:`multi_cuda_gpu_test` is the
  same decorator for the copies that run on a CUDA host (vllm_v0.34.0: vLLM 0.34.0 has no
  CPU build): it asks for that many CUDA devices.
- :func:`save_tokenizer`: the tokenizer the tests downloaded from the model hub
  (``TinyLlama/TinyLlama-1.1B-Chat-v1.0``), here ``tests/tiny_models.build_tokenizer``'s
  word-level tokenizer (512 ids, ``<s>`` prepended): the predictable model's vocabulary is
  1000, every id fits.
- :func:`tiny_llama` and :func:`config_only_model`: local models for the hub ids.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: tiny_models
import tiny_models

F = TypeVar("F", bound=Callable[..., None])

#: Where the local models are built (each builder is idempotent; shared by the runs).
MODELS = Path(tempfile.gettempdir()) / "speccompat-upstream-models"


def speccompat_active() -> bool:
    """speccompat is importable and not turned off (``SPECCOMPAT_DISABLE=1``)."""
    try:
        from speccompat import registry
    except ImportError:
        return False
    return not registry.disabled()


def save_tokenizer(path: str | Path) -> None:
    """A local tokenizer into ``path`` (for the hub tokenizer the tests downloaded)."""
    tiny_models.build_tokenizer(Path(path))


def tiny_llama(num_layers: int) -> str:
    """A random-weight Llama of ``num_layers`` layers (hidden 64) built by
    ``tests/tiny_models.build_llama``, for the hub id ``TinyLlama/TinyLlama-1.1B-Chat-v1.0``
    (22 layers) in configuration-level tests."""
    return str(tiny_models.build_llama(MODELS / f"llama-{num_layers}", num_layers=num_layers))


def config_only_model(name: str, config: Any, *, extra_special: tuple[str, ...] = (),
                      files: dict[str, dict[str, Any]] | None = None) -> str:
    """``config`` (a transformers config), the local tokenizer (``extra_special`` tokens in
    its last ids) and ``files`` (JSON, by file name), without weights, in ``MODELS/name``:
    for tests that load the model with ``load_format="dummy"``, which never reads a
    checkpoint. Rewritten only when something differs."""
    path = MODELS / name
    wanted = json.dumps({"config": config.to_dict(), "extra_special": list(extra_special),
                         "files": files or {}}, sort_keys=True, default=str)
    marker = path / "upstream_config.json"
    if marker.is_file() and marker.read_text() == wanted:
        return str(path)
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    tiny_models.build_tokenizer(path, extra_special=extra_special)
    for file_name, content in (files or {}).items():
        (path / file_name).write_text(json.dumps(content, indent=2) + "\n")
    marker.write_text(wanted)
    return str(path)


#: Set in the child interpreter, where the decorated test runs the test itself.
_CHILD_ENV = "SPECCOMPAT_UPSTREAM_TEST_CHILD"
#: Stands in for a pytest MonkeyPatch argument (the child makes its own).
_MONKEYPATCH = "<pytest.MonkeyPatch>"

_CHILD_SCRIPT = """
import os, pickle, sys, traceback
import importlib
import pytest

data = pickle.loads(sys.stdin.buffer.read())
def arg(value):
    return pytest.MonkeyPatch() if value == data["monkeypatch"] else value
outcome, code = {}, 0
try:
    target = importlib.import_module(data["module"])
    for name in data["qualname"].split("."):
        target = getattr(target, name)
    target(*[arg(a) for a in data["args"]], **{k: arg(v) for k, v in data["kwargs"].items()})
except pytest.skip.Exception as exc:
    outcome = {"skip": str(exc.msg)}
except BaseException as exc:
    code = 1
    outcome = {"traceback": traceback.format_exc()}
    try:
        outcome["exception"] = pickle.dumps(exc)
    except Exception:
        pass
with open(data["report"], "wb") as out:
    pickle.dump(outcome, out)
sys.stdout.flush()
os._exit(code)
"""


def spawn_new_process_for_each_test(func: F) -> F:
    """The test in a fresh interpreter (``python -c``), its folder and tests/upstream on
    ``PYTHONPATH`` so that the child imports the test module by its file name."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        if os.environ.get(_CHILD_ENV) == "1":
            func(*args, **kwargs)
            return
        with tempfile.NamedTemporaryFile(prefix=f"upstream_{func.__name__}_",
                                         suffix=".outcome", delete=False) as handle:
            report = handle.name

        def plain(value: Any) -> Any:
            return _MONKEYPATCH if isinstance(value, pytest.MonkeyPatch) else value

        payload = pickle.dumps({
            "module": func.__module__, "qualname": func.__qualname__,
            "args": [plain(a) for a in args],
            "kwargs": {k: plain(v) for k, v in kwargs.items()},
            "monkeypatch": _MONKEYPATCH, "report": report,
        })
        folder = Path(sys.modules[func.__module__].__file__ or ".").resolve().parent
        env = dict(os.environ, **{_CHILD_ENV: "1"})
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(folder), str(Path(__file__).resolve().parent),
                          str(Path(__file__).resolve().parent.parent),
                          os.environ.get("PYTHONPATH")]))
        outcome: dict[str, Any] = {}
        try:
            # Its own session, so that what the test leaves behind (a tensor-parallel worker
            # of an engine that died) is ended with it, as vLLM's fork variant does.
            child = subprocess.Popen([sys.executable, "-c", _CHILD_SCRIPT],
                                     stdin=subprocess.PIPE, env=env, start_new_session=True)
            child.communicate(payload)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with (contextlib.suppress(OSError, EOFError, pickle.UnpicklingError),
                  open(report, "rb") as source):
                outcome = pickle.load(source)
        finally:
            with contextlib.suppress(OSError):
                os.remove(report)
        if "skip" in outcome:
            pytest.skip(outcome["skip"])
        if "exception" in outcome:
            with contextlib.suppress(Exception):
                error = pickle.loads(outcome["exception"])
                if isinstance(error, BaseException):
                    raise error
        if "traceback" in outcome:
            raise AssertionError(f"{func.__name__} failed in its process:\n"
                                 f"{outcome['traceback']}")
        if child.returncode != 0:
            raise AssertionError(f"{func.__name__}'s process ended with {child.returncode} "
                                 "and no report (see its output above)")

    return wrapper  # type: ignore[return-value]


def create_new_process_for_each_test(method: str | None = None) -> Callable[[F], F]:
    """vLLM's decorator of that name; the test runs in a fresh interpreter whatever
    ``method`` says (a forked child deadlocked on this CPU machine)."""
    if method not in (None, "spawn", "fork"):
        raise ValueError(f"method={method!r}")
    return spawn_new_process_for_each_test


def multi_gpu_test(*, num_gpus: int) -> Callable[[F], F]:
    """vLLM's ``multi_gpu_test``: the test in its own process, skipped where this machine
    cannot run ``num_gpus`` ranks (CPU ranks here: one core each)."""
    cores = os.cpu_count() or 1
    skip = pytest.mark.skipif(cores < num_gpus,
                              reason=f"Need at least {num_gpus} CPU cores for {num_gpus} "
                              f"tensor-parallel ranks on CPU (this machine has {cores})")

    def wrapper(func: F) -> F:
        return skip(spawn_new_process_for_each_test(func))  # type: ignore[no-any-return]

    return wrapper


def multi_cuda_gpu_test(*, num_gpus: int) -> Callable[[F], F]:
    """vLLM's ``multi_gpu_test`` for the copies that run on a CUDA host: the test in its own
    process, skipped where fewer than ``num_gpus`` CUDA devices are visible, counted as
    vLLM's own ``multi_gpu_test`` counts them (the CUDA platform's stateless count, which
    starts no CUDA context in this process); none where vLLM's platform is not CUDA."""
    from vllm.platforms import current_platform

    gpus = current_platform.device_count() if current_platform.is_cuda() else 0
    skip = pytest.mark.skipif(gpus < num_gpus,
                              reason=f"Need at least {num_gpus} CUDA GPUs for {num_gpus} "
                              f"tensor-parallel ranks (this machine has {gpus})")

    def wrapper(func: F) -> F:
        return skip(spawn_new_process_for_each_test(func))  # type: ignore[no-any-return]

    return wrapper


def qwen3_0_6b_stand_in() -> str:
    """For the hub id ``Qwen/Qwen3-0.6B`` (read with ``load_format="dummy"``: configuration
    only): a ``Qwen3ForCausalLM`` configuration with its hidden size 1024 (the test asserts
    it) and its 28 layers, 8 heads of 64 and 2 KV heads (one per tensor-parallel rank), an
    intermediate size of 512 and the local tokenizer's 512 ids."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=tiny_models.VOCAB_SIZE, hidden_size=1024, intermediate_size=512,
        num_hidden_layers=28, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tiny_models.BOS_ID, eos_token_id=tiny_models.EOS_ID,
        pad_token_id=tiny_models.PAD_ID, dtype="bfloat16", architectures=["Qwen3ForCausalLM"])
    return config_only_model("qwen3-0.6b-stand-in", config)


def qwen35_0_8b_stand_in() -> str:
    """For the hub id ``Qwen/Qwen3.5-0.8B`` (read with ``load_format="dummy"``: configuration
    and processor only): a ``Qwen3_5ForConditionalGeneration`` configuration whose text model
    has its hidden size 1024 (the test asserts it) and its 24 layers, three linear-attention
    (gated delta net) layers to one full-attention layer, a 1-layer vision tower, the local
    tokenizer with Qwen's four vision tokens as its last ids, and the image and video
    processor configurations vLLM's Qwen3.5 processor loads (Qwen2VL image processor,
    Qwen3VL video processor, patch 16, merge 2)."""
    from transformers import Qwen3_5Config

    vision_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    first = tiny_models.VOCAB_SIZE - len(vision_tokens)
    layer_types = ["linear_attention", "linear_attention", "linear_attention",
                   "full_attention"] * 6
    config = Qwen3_5Config(
        text_config={
            "vocab_size": tiny_models.VOCAB_SIZE, "hidden_size": 1024,
            "intermediate_size": 512, "num_hidden_layers": 24, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 4,
            "linear_num_value_heads": 8, "linear_key_head_dim": 64,
            "linear_value_head_dim": 64, "layer_types": layer_types,
            "max_position_embeddings": 4096, "tie_word_embeddings": True,
            "bos_token_id": tiny_models.BOS_ID, "eos_token_id": tiny_models.EOS_ID,
            "pad_token_id": tiny_models.PAD_ID, "dtype": "bfloat16"},
        vision_config={"depth": 1, "hidden_size": 64, "intermediate_size": 128,
                       "num_heads": 2, "out_hidden_size": 1024},
        vision_start_token_id=first, vision_end_token_id=first + 1,
        image_token_id=first + 2, video_token_id=first + 3,
        tie_word_embeddings=True, architectures=["Qwen3_5ForConditionalGeneration"],
        dtype="bfloat16")
    patches = {"processor_class": "Qwen3VLProcessor", "patch_size": 16,
               "temporal_patch_size": 2, "merge_size": 2}
    files = {
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor",
                                     "min_pixels": 1024, "max_pixels": 65536, **patches},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor",
                                           **patches},
    }
    return config_only_model("qwen3.5-0.8b-stand-in", config, extra_special=vision_tokens,
                             files=files)
