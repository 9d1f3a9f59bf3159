"""The environment vLLM's CPU build runs under in tests, benchmarks, the demo and nox.

Small KV cache (the default asks for a share of RAM), spawned workers (a parent that
touched torch cannot fork safely), one OpenMP core per TP rank (this machine has two),
and no model hub (every model is built locally).
"""

from __future__ import annotations

import os

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def set_defaults() -> None:
    """``CPU_ENV`` into this process's environment, where the caller has not set a value."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
