from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest

from speccompat.inprocess.adapters.scheduler_config_is_encoder_decoder import ID
from support import (
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]
SPECULATORS_ARGS = {"max_num_seqs": 32, "max_model_len": 1024, "max_num_batched_tokens": 8192}


@vllm_in(">=0.12.0", "SchedulerConfig has no required is_encoder_decoder before 0.12.0")
def test_raw_scheduler_config_requires_is_encoder_decoder() -> None:
    from vllm.config import SchedulerConfig

    with pytest.raises(Exception, match="is_encoder_decoder"):
        SchedulerConfig(**SPECULATORS_ARGS)


@vllm_in("<0.11.1", "SchedulerConfig has is_encoder_decoder from 0.11.1 on")
def test_raw_scheduler_config_ignores_the_unknown_is_encoder_decoder() -> None:
    """Why speculators 0.4.0's SchedulerConfig(..., is_encoder_decoder=False) needs no
    adapter on vLLM 0.11.0: the pydantic dataclass drops arguments it does not know."""
    from vllm.config import SchedulerConfig

    assert "is_encoder_decoder" not in inspect.signature(SchedulerConfig).parameters
    config = SchedulerConfig(**SPECULATORS_ARGS, is_encoder_decoder=False)
    assert config.max_num_batched_tokens == 8192
    assert not hasattr(config, "is_encoder_decoder")


@needs_adapter(ID, "speculators 0.4.0 passes is_encoder_decoder=False itself")
def test_generator_call_gets_a_decoder_only_config(generator_module: ModuleType) -> None:
    from vllm.config import SchedulerConfig

    with only(ID):
        config = generator_module.SchedulerConfig(**SPECULATORS_ARGS)
    assert isinstance(config, SchedulerConfig)
    assert config.max_num_batched_tokens == 8192
    assert generator_module.SchedulerConfig is SchedulerConfig  # reverted


@needs_adapter(ID, "speculators 0.4.0 passes is_encoder_decoder=False itself")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(Exception, match="is_encoder_decoder"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass
