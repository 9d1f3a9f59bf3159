"""The environment vLLM's CPU build runs under in tests, benchmarks, the demo and nox.

Small KV cache (the default asks for a share of RAM), spawned workers (a parent that
touched torch cannot fork safely), one OpenMP core per TP rank (this machine has two),
and no model hub (every model is built locally). Where the installed CPU build refuses to
start a worker without tcmalloc and Intel OpenMP preloaded (vLLM 0.18.0), both are preloaded
for the processes it starts (``apt install libtcmalloc-minimal4``; ``intel-openmp`` comes
with the build).
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import re
import sys
from pathlib import Path

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


MISSING_FIX = {
    "libtcmalloc": "apt install libtcmalloc-minimal4",
    "libiomp": "intel-openmp, which the CPU build requires, is missing from this environment",
}


def set_defaults() -> None:
    """``CPU_ENV`` into this process's environment, where the caller has not set a value,
    and the preloads the CPU worker demands (for the processes started from here)."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    preload = os.environ.get("LD_PRELOAD", "")
    for name, path in _demanded_preloads().items():
        if name in preload:
            continue
        if path is None:
            # Otherwise every worker dies at start and each test fails on its own.
            print(f"cpu_env: this vLLM's CPU worker refuses to start without {name} in "
                  f"LD_PRELOAD, and it was not found on this machine ({MISSING_FIX[name]})",
                  file=sys.stderr)
            continue
        preload = f"{preload}:{path}" if preload else path
    if preload:
        os.environ["LD_PRELOAD"] = preload


def _demanded_preloads() -> dict[str, str | None]:
    """The libraries whose absence from LD_PRELOAD the installed CPU worker treats as an
    error (read from its source, without importing vLLM), each with where it is found."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    worker = Path(next(iter(spec.submodule_search_locations)), "v1", "worker", "cpu_worker.py")
    try:
        source = worker.read_text(encoding="utf-8")
    except OSError:
        return {}
    if not re.search(r'raise RuntimeError\(\s*f"\{name\} is not found in LD_PRELOAD', source):
        return {}
    iomp = glob.glob(os.path.join(sys.prefix, "lib", "libiomp5.so"))
    return {"libtcmalloc": ctypes.util.find_library("tcmalloc_minimal"),
            "libiomp": iomp[0] if iomp else None}
