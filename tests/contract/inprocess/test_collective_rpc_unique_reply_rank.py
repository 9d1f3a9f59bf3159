from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import speccompat
from speccompat.inprocess.adapters.collective_rpc_unique_reply_rank import (
    ID,
    ID_V04,
    BareReplyExecutor,
    ListReplyExecutor,
)
from support import (
    adapter_applies,
    needs_adapter,
    requires_speculators,
    requires_vllm,
    run_python,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


@pytest.fixture(scope="module")
def executor(vllm_config: Any) -> Any:
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    executor = MultiprocExecutor(vllm_config=vllm_config)
    yield executor
    executor.shutdown()


@vllm_in(">=0.11.1", "a unique reply is a one-element list before 0.11.1")
def test_raw_unique_reply_is_the_bare_result(executor: Any) -> None:
    everyone = executor.collective_rpc("get_kv_cache_spec")
    rank0 = executor.collective_rpc("get_kv_cache_spec", unique_reply_rank=0)
    assert isinstance(everyone, list) and len(everyone) == 1
    assert isinstance(rank0, dict) and rank0.keys() == everyone[0].keys()


@vllm_in("<0.11.1", "a unique reply is the bare result from 0.11.1 on")
def test_raw_unique_reply_is_a_one_element_list(executor: Any) -> None:
    everyone = executor.collective_rpc("get_kv_cache_spec")
    rank0 = executor.collective_rpc("get_kv_cache_spec", unique_reply_rank=0)
    assert isinstance(rank0, list) and len(rank0) == 1
    assert isinstance(rank0[0], dict) and rank0[0].keys() == everyone[0].keys()


def test_speccompat_collective_rpc_contract(executor: Any) -> None:
    everyone = speccompat.collective_rpc(executor, "get_kv_cache_spec")
    rank0 = speccompat.collective_rpc(executor, "get_kv_cache_spec", rank=0)
    assert isinstance(everyone, list) and len(everyone) == 1
    assert isinstance(rank0, dict) and rank0.keys() == everyone[0].keys()
    with pytest.raises(ValueError):
        speccompat.collective_rpc(executor, "get_kv_cache_spec", rank=-1)


@needs_adapter(ID, "speculators 0.4.0 reads the bare reply")
def test_consumer_view_keeps_the_list_contract(executor: Any) -> None:
    view = ListReplyExecutor(executor)
    replies = view.collective_rpc("get_kv_cache_spec", unique_reply_rank=0)
    assert isinstance(replies, list) and len(replies) == 1 and isinstance(replies[0], dict)
    assert view.collective_rpc("get_kv_cache_spec")[0].keys() == replies[0].keys()
    assert view.vllm_config is executor.vllm_config  # everything else is the executor's


UNIPROC = """
import json, sys
import speccompat
from speccompat import registry
from vllm.engine.arg_utils import EngineArgs
try:
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
except ImportError:  # vLLM 0.11.0: the V1 class is in abstract.py
    from vllm.v1.executor.abstract import UniProcExecutor
config = EngineArgs(model=sys.argv[1], max_model_len=256, enforce_eager=True).create_engine_config()
executor = UniProcExecutor(config)
everyone = speccompat.collective_rpc(executor, "get_kv_cache_spec")
rank0 = speccompat.collective_rpc(executor, "get_kv_cache_spec", rank=0)
print(json.dumps([type(everyone).__name__, len(everyone), type(rank0).__name__]), flush=True)
try:
    executor.shutdown()
except RuntimeError as exc:  # vLLM 0.20.0's CPU runner syncs torch's CUDA accelerator here
    print(f"shutdown failed after the replies were read: {exc}", file=sys.stderr)
"""


def test_uniproc_executor_has_the_same_contract(tiny_llama: Path) -> None:
    out = run_python("-c", textwrap.dedent(UNIPROC), str(tiny_llama), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == '["list", 1, "dict"]'


@needs_adapter(ID, "speculators 0.4.0 reads the bare reply")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12, 30])
    # [0] takes layer 1's tensor, whose truth value is ambiguous.
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1, 2]) as gen, \
            pytest.raises(RuntimeError, match="ambiguous"):
        gen.generate(prompts)


@needs_adapter(ID_V04, "this vLLM returns the bare reply speculators 0.4.0 reads")
def test_v04_consumer_view_gives_the_bare_reply(executor: Any) -> None:
    view = BareReplyExecutor(executor)
    reply = view.collective_rpc("get_kv_cache_spec", unique_reply_rank=0)
    everyone = view.collective_rpc("get_kv_cache_spec")
    assert isinstance(reply, dict) and reply.keys() == everyone[0].keys()
    assert isinstance(everyone, list) and len(everyone) == 1  # all ranks: still a list
    assert view.vllm_config is executor.vllm_config


@needs_adapter(ID_V04, "this vLLM returns the bare reply speculators 0.4.0 reads")
def test_v04_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12, 30])
    # The request ids are looked up in the one-element list, not in the dict inside it, and
    # reporting one as missing calls .keys() on that list.
    with speculators_generator(tiny_llama, exclude=(ID_V04,), layer_ids=[1, 2]) as gen, \
            pytest.raises(AttributeError, match="'list' object has no attribute 'keys'"):
        gen.generate(prompts)


def test_wrapped_generator_classes_keep_their_types(
    generator_module: ModuleType, executor: Any, vllm_config: Any,
) -> None:
    """After apply(), the generator's names for vLLM classes (this adapter's
    MultiprocExecutor, and Scheduler, SchedulerConfig, CacheConfig where others wrap them)
    answer isinstance, issubclass and class attributes as the real vLLM classes do."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    before = {n: v for n, v in vars(generator_module).items() if isinstance(v, type)}
    speccompat.registry._apply(sides=(speccompat.Side.DRIVER,))
    try:
        replaced = {n: (real, getattr(generator_module, n)) for n, real in before.items()
                    if getattr(generator_module, n) is not real}
        if adapter_applies(ID)[0] or adapter_applies(ID_V04)[0]:
            assert replaced["MultiprocExecutor"][0] is MultiprocExecutor
            name = replaced["MultiprocExecutor"][1]
            view = (ListReplyExecutor if adapter_applies(ID)[0] else BareReplyExecutor)(executor)
            assert isinstance(executor, name) and isinstance(view, name)
            assert isinstance(view, MultiprocExecutor)
        configs = [vllm_config.scheduler_config, vllm_config.cache_config]
        for attr, (real, name) in replaced.items():
            assert isinstance(name, type), attr
            assert isinstance(real.__new__(real), name), attr
            assert not isinstance(object(), name), attr
            for config in configs:
                assert isinstance(config, name) is isinstance(config, real), attr
            assert issubclass(name, real) and issubclass(real, name), attr
            assert all(issubclass(name, base) for base in real.__mro__), attr
            assert (name.__name__, name.__qualname__, name.__module__, name.__doc__) == (
                real.__name__, real.__qualname__, real.__module__, real.__doc__), attr
            for member in dir(real):
                if not member.startswith("__") and member != "_abc_impl":
                    assert (inspect.getattr_static(name, member)
                            is inspect.getattr_static(real, member)), f"{attr}.{member}"
    finally:
        speccompat.revert()
    assert all(getattr(generator_module, n) is real for n, real in before.items())
