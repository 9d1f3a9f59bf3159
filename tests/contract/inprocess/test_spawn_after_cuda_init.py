"""vLLM's forced spawn vs its environment cache, and the generator's executor start method.

CUDA cannot be initialised on the CPU test machines; where a test needs "this process
has touched CUDA" it says so by replacing ``torch.cuda.is_initialized``, the one call
vLLM's ``cuda_is_initialized()`` makes. tests/gpu has the real case on a GPU.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from speccompat.inprocess.adapters.spawn_after_cuda_init import ID
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    run_python,
    runs_models,
)

pytestmark = [requires_vllm, requires_speculators]
TESTS = Path(__file__).resolve().parents[2]


def run_script(body: str) -> str:
    """A fresh interpreter without the test suite's VLLM_WORKER_MULTIPROC_METHOD=spawn."""
    script = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body)
    done = run_python("-c", script, unset=["VLLM_WORKER_MULTIPROC_METHOD"])
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_raw_cached_environment_hides_the_forced_spawn() -> None:
    out = run_script("""
        import os
        from vllm import envs
        from vllm.utils import system_utils
        envs.enable_envs_cache()                       # what an engine does once it is up
        print("OUT", system_utils.get_mp_context().get_start_method())
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"   # what _maybe_force_spawn sets
        print("OUT", system_utils.get_mp_context().get_start_method())
    """) if _has_system_utils() else pytest.skip("get_mp_context lives in vllm.utils here")
    assert printed(out) == ["fork", "fork"]


def test_force_spawn_reaches_get_mp_context() -> None:
    out = run_script("""
        from vllm import envs
        from vllm.utils import system_utils
        from speccompat.inprocess.adapters.spawn_after_cuda_init import force_spawn
        envs.enable_envs_cache()
        print("OUT", system_utils.get_mp_context().get_start_method())
        force_spawn()
        print("OUT", system_utils.get_mp_context().get_start_method())
        print("OUT", envs.VLLM_HOST_IP == envs.VLLM_HOST_IP)  # the cache still works afterwards
    """) if _has_system_utils() else pytest.skip("get_mp_context lives in vllm.utils here")
    assert printed(out) == ["fork", "spawn", "True"]


GENERATOR_RUN = """
    import torch, warnings
    import speccompat, tiny_models
    from vllm import envs
    report = speccompat.apply(exclude={exclude!r})
    envs.enable_envs_cache()                 # an engine ran in this process before
    torch.cuda.is_initialized = lambda: True  # ...on a GPU (see the module docstring)
    from support import speculators_generator
    model = tiny_models.build_llama({model!r}, dtype="bfloat16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with speculators_generator(model, apply=False, layer_ids=[1]) as gen:
            print("METHOD", envs.VLLM_WORKER_MULTIPROC_METHOD)
            out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12]))
            print("ROWS", out[0]["hidden_states"][0].shape[0])
    print("WARNED", any("spawn" in str(w.message) for w in caught))
"""


@runs_models
@needs_adapter(ID)
def test_generator_spawns_after_cuda_init(tmp_path: Path) -> None:
    out = run_script(GENERATOR_RUN.format(exclude=(), model=str(tmp_path / "llama")))
    assert "METHOD spawn" in out and "ROWS 12" in out and "WARNED True" in out


@runs_models
@needs_adapter(ID)
def test_generator_forks_without_it(tmp_path: Path) -> None:
    # On CPU a forked worker still runs; on a GPU it fails at its first CUDA call.
    out = run_script(GENERATOR_RUN.format(exclude=(ID,), model=str(tmp_path / "llama")))
    assert "METHOD fork" in out and "WARNED False" in out


def printed(out: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("OUT ")]


def _has_system_utils() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm.utils.system_utils") is not None
