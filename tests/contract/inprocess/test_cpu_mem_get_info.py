from __future__ import annotations

import os
from types import ModuleType

import pytest

from speccompat.inprocess.adapters.cpu_mem_get_info import ID
from support import only, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


@pytest.fixture
def cpu_only() -> None:
    import torch
    from vllm.platforms import current_platform

    if torch.cuda.is_available():
        pytest.skip("a CUDA device answers mem_get_info; this behaviour is the CPU build's")
    if not current_platform.is_cpu():  # the CUDA wheel on a machine without a GPU
        pytest.skip("this vLLM build is not the CPU one; the behaviour is the CPU build's")


@pytest.mark.usefixtures("cpu_only")
def test_raw_mem_get_info_has_no_cpu_answer() -> None:
    import torch

    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.mem_get_info()


@pytest.mark.usefixtures("cpu_only")
def test_generator_sees_the_cpu_kv_cache_space(generator_module: ModuleType) -> None:
    import torch

    space = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * (1 << 30))
    if hasattr(generator_module, "mem_get_info"):  # speculators 0.4.0: its own helper
        helper = generator_module.mem_get_info
        with only(ID):
            assert generator_module.mem_get_info() == (space, space)
        assert generator_module.mem_get_info is helper
        return
    with only(ID):  # speculators 0.3.0: torch.cuda.mem_get_info()
        assert generator_module.torch.cuda.mem_get_info() == (space, space)
        assert generator_module.torch.float32 is torch.float32  # the rest is the real torch
    assert generator_module.torch is torch


@pytest.mark.usefixtures("cpu_only")
def test_generator_fails_without_it(tiny_llama: object) -> None:
    with pytest.raises((RuntimeError, AssertionError)), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]  # type: ignore[arg-type]
    ):
        pass
