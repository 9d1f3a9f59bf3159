from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from speccompat.inprocess.adapters.request_eos_token_id_removed import ID
from support import (
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]
BEFORE_0_17 = "Request.__init__ takes eos_token_id before vLLM 0.17.0"


def _speculators_request(request_cls: type) -> object:
    from vllm.sampling_params import SamplingParams

    return request_cls(request_id="req_0_0", prompt_token_ids=[5, 6, 7],
                       sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                       pooling_params=None, eos_token_id=2, arrival_time=0.0)


@vllm_in(">=0.17.0", BEFORE_0_17)
def test_raw_request_rejects_eos_token_id() -> None:
    from vllm.v1.request import Request

    with pytest.raises(TypeError, match="eos_token_id"):
        _speculators_request(Request)


@needs_adapter(ID, BEFORE_0_17)
def test_generator_request_carries_eos_on_sampling_params(generator_module: ModuleType) -> None:
    from vllm.v1.request import Request

    with only(ID):
        request = _speculators_request(generator_module.Request)
    assert isinstance(request, Request)
    assert request.sampling_params.eos_token_id == 2
    assert request.num_prompt_tokens == 3
    assert generator_module.Request is Request


@needs_adapter(ID, BEFORE_0_17)
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [6])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]) as gen, \
            pytest.raises(TypeError, match="eos_token_id"):
        gen.generate(prompts)
