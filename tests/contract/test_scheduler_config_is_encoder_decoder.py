from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from speccompat.adapters.scheduler_config_is_encoder_decoder import ID
from support import only, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]
SPECULATORS_ARGS = {"max_num_seqs": 32, "max_model_len": 1024, "max_num_batched_tokens": 8192}


def test_raw_scheduler_config_requires_is_encoder_decoder() -> None:
    from vllm.config import SchedulerConfig

    with pytest.raises(Exception, match="is_encoder_decoder"):
        SchedulerConfig(**SPECULATORS_ARGS)


def test_generator_call_gets_a_decoder_only_config(generator_module: ModuleType) -> None:
    from vllm.config import SchedulerConfig

    with only(ID):
        config = generator_module.SchedulerConfig(**SPECULATORS_ARGS)
    assert isinstance(config, SchedulerConfig)
    assert config.max_num_batched_tokens == 8192
    assert generator_module.SchedulerConfig is SchedulerConfig  # reverted


def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(Exception, match="is_encoder_decoder"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass
