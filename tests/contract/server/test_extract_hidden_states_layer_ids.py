"""vLLM takes any eagle_aux_hidden_state_layer_ids for extract_hidden_states; the adapter
checks them where the model runner reads them, against ``server.servable.servable_aux_ids``.

The table in ``servable_aux_ids`` rests on the model sources read here per release (the
DeepSeek final-layer capture from 0.25.0, the residual added before DeepSeek's first layer,
Llama's capture after the last layer from 0.18.0). The server refusing unservable ids at
start-up, and the raw first-request failure, are in tests/e2e/server/test_server_path.py."""

from __future__ import annotations

import pytest

import speccompat
from speccompat import registry
from speccompat.patching import patched_by
from speccompat.record import ExtractionPath
from speccompat.server.adapters.extract_hidden_states_layer_ids import FROM_CONFIG, ID, RUNNER
from speccompat.server.servable import servable_aux_ids
from speccompat.targets import source_def
from support import needs_adapter, requires_vllm, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM has no extract_hidden_states before 0.17.0")
DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
LLAMA = "vllm.model_executor.models.llama"


def _installed() -> str:
    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version)


def _body(module: str, qualname: str) -> str:
    found = source_def(module, qualname)
    assert found is not None, f"{module}.{qualname} not found"
    return found.text


@applies
def test_raw_vllm_takes_the_ids_unchecked() -> None:
    body = _body(RUNNER, f"GPUModelRunner.{FROM_CONFIG}")
    assert "eagle_aux_hidden_state_layer_ids" in body
    assert "num_hidden_layers" not in body and "raise" not in body


@applies
def test_raw_deepseek_serves_the_final_id_only_from_0_25() -> None:
    forward = _body(DEEPSEEK, "DeepseekV2Model.forward")
    final = "if self.end_layer in self.aux_hidden_state_layers" in forward
    table = servable_aux_ids("DeepseekV3ForCausalLM", 4, _installed()).high == 4
    assert final is table, (_installed(), final)


@applies
@vllm_in(">=0.18.0", "DeepSeek V2/V3 are not SupportsEagle3 before 0.18.0: their forward "
         "collects no aux states, so there is no id-0 residual to get wrong")
def test_raw_deepseek_id_0_adds_a_residual_that_does_not_exist_yet() -> None:
    forward = _body(DEEPSEEK, "DeepseekV2Model.forward")
    assert "residual = None" in forward  # before the first layer
    assert "aux_hidden_state = hidden_states + residual" in forward or (
        "aux_hidden_states.append(hidden_states + residual)" in forward)
    assert servable_aux_ids("DeepseekV3ForCausalLM", 4, _installed()).low == 1


@applies
def test_raw_llama_serves_the_final_id_from_0_18() -> None:
    forward = _body(LLAMA, "LlamaModel.forward")
    after_each = "idx + 1" in forward  # the state after layer idx is id idx + 1
    servable = servable_aux_ids("LlamaForCausalLM", 4, _installed())
    assert after_each is (servable.high == 4)
    # Before each layer instead (0.17): id 0 adds the residual that is still None.
    before_each = "aux_hidden_states.append(hidden_states + residual)" in forward
    assert before_each is (servable.low == 1)


@applies
def test_the_runner_reads_the_ids_once_while_loading_the_model() -> None:
    """0.17-0.21 read them inline in load_model, 0.22+ in _setup_eagle3_aux_hidden_state_outputs:
    the one call site the wrapped method has on every release."""
    source = _body(RUNNER, "GPUModelRunner.load_model")
    setup = source_def(RUNNER, "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs")
    calls = source.count(f"self.{FROM_CONFIG}()") + (
        setup.text.count(f"self.{FROM_CONFIG}()") if setup is not None else 0)
    assert calls == 1


@applies
def test_the_ids_reader_is_wrapped_and_reverted() -> None:
    from vllm.v1.worker import gpu_model_runner

    original = vars(gpu_model_runner.GPUModelRunner)[FROM_CONFIG]
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        assert patched_by(vars(gpu_model_runner.GPUModelRunner)[FROM_CONFIG]) == ID
    finally:
        speccompat.revert()
    assert vars(gpu_model_runner.GPUModelRunner)[FROM_CONFIG] is original


@pytest.mark.parametrize("ids", [[1, 2, 5], [2, 2]])
@applies
def test_the_check_refuses_what_the_model_cannot_serve(ids: list[int]) -> None:
    from speccompat.layers import LayerIdError

    with pytest.raises(LayerIdError):
        servable_aux_ids("LlamaForCausalLM", 4, _installed()).check(ids, "ids")
