"""vLLM takes any eagle_aux_hidden_state_layer_ids for extract_hidden_states; the adapter
checks them, and puts them in slot order, where vLLM builds the draft config that every
runner reads them from (V1's GPU and CPU runners, Model Runner V2), against
``server.servable.servable_aux_ids``.

The table in ``servable_aux_ids`` rests on the model sources read here per release (the
DeepSeek final-layer capture from 0.25.0, the residual added before DeepSeek's first layer,
Llama's capture after the last layer from 0.18.0). The server refusing unservable ids at
start-up, and the raw silent copy, are in tests/e2e/server/test_server_path.py."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.errors import UpstreamLimitationError
from speccompat.layers import LayerIdError
from speccompat.patching import patched_by
from speccompat.record import ExtractionPath
from speccompat.server.adapters.extract_hidden_states_layer_ids import (
    CONFIG,
    CONFIG_CLASS,
    ID,
    IDS,
)
from speccompat.server.servable import servable_aux_ids
from speccompat.targets import module_source, source_def
from support import extract_engine_config, needs_adapter, requires_vllm, runs_models, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM has no extract_hidden_states before 0.17.0")
DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
LLAMA = "vllm.model_executor.models.llama"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
# DeepSeek-V4 / V4.1's DeepseekV4Model, one module per platform (vllm/models/, vLLM >= 0.22).
DEEPSEEK_V4_MODELS = tuple(f"vllm.models.{package}.{platform}.model"
                           for package in ("deepseek_v4", "deepseek_v41")
                           for platform in ("nvidia", "amd", "xpu", "cpu"))
DEEPSEEK_V4_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration",
                             "DeepseekV41ForCausalLM")
V2_AUX_LAYERS = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
V1_PROPOSER = "vllm.v1.spec_decode.extract_hidden_states"
V2_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.extract_hidden_states"
# Where vLLM builds the draft config: SpeculativeConfig until 0.33, a V2 speculator config
# in 0.34.
BUILDERS = ("vllm.config.speculative",
            "vllm.v1.worker.gpu.spec_decode.extract_hidden_states_config")


def _installed() -> str:
    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version)


def _body(module: str, qualname: str) -> str:
    found = source_def(module, qualname)
    assert found is not None, f"{module}.{qualname} not found"
    return found.text


def _target(layers: int = 4) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=layers, architectures=["LlamaForCausalLM"])


def _draft_config(ids: list[int]) -> Any:
    import importlib

    return getattr(importlib.import_module(CONFIG), CONFIG_CLASS)(_target(), **{IDS: ids})


@pytest.fixture
def adapter() -> Iterator[None]:
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED, report
        yield
    finally:
        speccompat.revert()


@applies
def test_raw_vllm_takes_any_ids_into_the_draft_config() -> None:
    """Out of range, out of order, repeated: vLLM's config keeps them as given."""
    assert getattr(_draft_config([3, 1, 3, 9]), IDS) == [3, 1, 3, 9]


@applies
def test_vllm_builds_the_draft_config_from_the_target_config() -> None:
    """``ExtractHiddenStatesConfig(<target hf_config>, **hf_config)``: the wrapped __init__
    sees the target model's architecture and layer count (0.17-0.33 in SpeculativeConfig,
    0.34 in Model Runner V2's speculator config)."""
    sources = [module_source(m) or "" for m in BUILDERS]
    calls = [text for text in sources if f"{CONFIG_CLASS}(" in text]
    assert calls, "no module builds ExtractHiddenStatesConfig"
    for text in calls:
        assert "copy.copy(self.target_model_config)" in text or \
            "copy.copy(spec.target_model_config)" in text
        assert "draft_model_config.hf_config, **hf_config" in text


@applies
def test_every_runner_reads_the_ids_from_the_draft_config() -> None:
    """The aux layers the model returns and the buffers the states land in both come from
    the draft config's ids, on each runner the release has."""
    readers = [(V1_RUNNER, "GPUModelRunner._get_eagle3_aux_layers_from_config"),
               (V2_AUX_LAYERS, "get_eagle3_aux_layers_from_config")]
    found = [(m, q, d) for m, q in readers if (d := source_def(m, q)) is not None]
    assert found, "no runner reads eagle_aux_hidden_state_layer_ids"
    for module, qualname, body in found:
        assert "draft_model_config" in body.text and IDS in body.text, (module, qualname)
    sized = [text for m in (V1_PROPOSER, V2_SPECULATOR) if (text := module_source(m))]
    assert sized
    for text in sized:
        assert "self.num_hidden_states = len(layer_ids)" in text and IDS in text


@applies
@vllm_in(">=0.30.0", "before 0.30 each model walks its layers and tests membership: the "
         "same ascending order, without a line that says so")
def test_raw_model_stores_its_aux_layers_sorted_from_0_30() -> None:
    """vLLM PR #50514: the mixin's setter sorts and de-duplicates, while the buffers keep
    len(ids) slots (above), so a repeated id leaves a slot no layer fills."""
    setter = source_def("vllm.model_executor.models.interfaces",
                        "EagleModelMixin._set_aux_hidden_state_layers")
    assert setter is not None and "tuple(sorted(set(layers)))" in setter.text


@applies
@vllm_in(">=0.29.0", "Model Runner V2's extract_hidden_states speculator came with 0.29.0")
def test_raw_v2_refuses_a_state_count_other_than_len_ids() -> None:
    """V2 raises at the first request where the model returns fewer states than ids."""
    text = module_source(V2_SPECULATOR) or ""
    assert "len(aux_hidden_states) != self.num_hidden_states" in text


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
@vllm_in(">=0.25.0", "DeepseekV4Model (in vLLM from 0.20.0) has no aux capture before 0.25.0")
def test_raw_deepseek_v4_never_captures_before_layer_0() -> None:
    """DeepseekV4Model (DeepSeek-V4, V4.1 and the V4 multimodal wrapper's text model) tests
    ``idx + 1`` after each layer (V4.1: the next layer hands back the previous layer's state
    through ``capture_previous_aux``, and layer 0 has none), never ``idx`` before it: id 0 is
    never captured, and speccompat's first-layer adapter patches DeepseekV2Model, not this.
    ``servable_aux_ids`` refuses id 0 for these architectures whatever that adapter does.
    A platform's model with no aux capture at all captures no id either (vLLM 0.25.0's AMD
    one, before it gained the capture in 0.26.0)."""
    found = {module: text for module in DEEPSEEK_V4_MODELS
             if (text := module_source(module)) is not None}
    if not found:
        pytest.skip(f"vLLM {_installed()} has no vllm.models.deepseek_v4 model modules: "
                    "DeepseekV4Model has an aux capture from vLLM 0.25.0 only")
    capturing = {module: text for module, text in found.items()
                 if "aux_hidden_state_layers" in text}
    assert capturing, f"no DeepseekV4Model captures aux states: {sorted(found)}"
    for module, text in capturing.items():
        assert "class DeepseekV4Model(" in text, module
        after = re.search(r"\(?idx \+ 1\)? in self\.aux_hidden_state_layers", text)
        previous = "capture_previous_aux=idx in self.aux_hidden_state_layers" in text
        assert after or previous, f"{module}: no aux capture after a layer"
        before = [line.strip() for line in text.splitlines()
                  if re.search(r"\bidx in self\.aux_hidden_state_layers", line)
                  and "capture_previous_aux=" not in line]
        assert not before, f"{module} captures before a layer: {before}"
        if previous:
            # The layer's forward (its multi-line return annotation is past source_def):
            # the branch for the first layer (no residual yet) hands back no state.
            layer = text.split("class DeepseekV4DecoderLayer(", 1)[-1]
            assert "if residual is None:" in layer and "previous_aux = " in layer, module
            first = layer.split("if residual is None:", 1)[1].split("\n        elif ", 1)[0]
            assert "previous_aux" not in first, f"{module}: layer 0 hands back a state"
    for architecture in DEEPSEEK_V4_ARCHITECTURES:
        servable = servable_aux_ids(architecture, 4, _installed(), first_id_repaired=True,
                                    final_id_repaired=True)
        assert (servable.low, servable.high) == (1, 4), architecture


@applies
def test_deepseek_v4_id_0_is_refused_at_start_up(adapter: None) -> None:
    """The adapter's check, with a config that does not go through transformers' layer-type
    validation (a DeepSeek-V4 one does not get that far: the test below)."""
    from transformers import PretrainedConfig

    target = PretrainedConfig(architectures=["DeepseekV4ForCausalLM"], num_hidden_layers=4)
    import importlib

    config_class = getattr(importlib.import_module(CONFIG), CONFIG_CLASS)
    with pytest.raises(LayerIdError, match=r"id 0 is never captured by DeepseekV4ForCausalLM"):
        config_class(target, **{IDS: [0, 2, 4]})
    assert getattr(config_class(target, **{IDS: [4, 2]}), IDS) == [2, 4]


@applies
def test_deepseek_v4_upstream_refusal_becomes_an_upstream_limitation_error(
        adapter: None) -> None:
    """Where vLLM's own __init__ fails transformers' validate_layer_type for a DeepSeek-V4
    target (tests/contract/facts/test_deepseek_v4_extract_config.py), the adapter raises an
    UpstreamLimitationError naming vLLM, the architecture, transformers and the message,
    the original chained."""
    import importlib

    transformers = pytest.importorskip("transformers")
    config_class = getattr(transformers, "DeepseekV4Config", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4Config")
    from tiny_models import deepseek_v4_config

    target = config_class(**{k: v for k, v in deepseek_v4_config().items()
                             if k != "model_type"})
    draft = getattr(importlib.import_module(CONFIG), CONFIG_CLASS)
    try:
        draft(copy.copy(target), **{IDS: [1, 2, 4]})
    except UpstreamLimitationError as error:
        text = str(error)
        assert error.__cause__ is not None and "UpstreamLimitationError" not in repr(
            type(error.__cause__))
        assert f"vLLM {_installed()}'s extract_hidden_states cannot build its draft config " \
            f"for DeepseekV4ForCausalLM under transformers {transformers.__version__}" in text
        assert re.search(r"The `mlp_layer_types` entries must be in \([^)]*\) but got "
                         r"\['hash_moe'", text), text
        assert "upstream limitation of vLLM" in text and "no workaround" in text
        assert "track the upstream issue" in text
    except Exception as error:  # pragma: no cover - the failure being pinned
        pytest.fail(f"not turned into UpstreamLimitationError: {type(error).__name__}: {error}")
    else:
        pytest.skip("vLLM builds the draft config for DeepSeek-V4 here: the upstream problem "
                    "is gone (see tests/contract/facts/test_deepseek_v4_extract_config.py)")


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
def test_the_config_init_is_wrapped_and_reverted() -> None:
    import importlib

    owner = getattr(importlib.import_module(CONFIG), CONFIG_CLASS)
    original = vars(owner)["__init__"]
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        assert patched_by(vars(owner)["__init__"]) == ID
    finally:
        speccompat.revert()
    assert vars(owner)["__init__"] is original


@applies
def test_unordered_and_repeated_ids_become_the_slot_order(adapter: None) -> None:
    assert getattr(_draft_config([3, 1, 3]), IDS) == [1, 3]
    # Both edges of what the release serves (1..3 on 0.17 without its edge-id adapter).
    servable = servable_aux_ids("LlamaForCausalLM", 4, _installed())
    assert getattr(_draft_config([servable.high, servable.low]), IDS) == [servable.low,
                                                                          servable.high]


@pytest.mark.parametrize("ids", [[1, 5], [-1, 2]])
@applies
def test_an_id_the_model_cannot_serve_is_refused(adapter: None, ids: list[int]) -> None:
    with pytest.raises(LayerIdError, match=r"for LlamaForCausalLM on vLLM .*cannot be served"):
        _draft_config(ids)


@applies
@runs_models
def test_a_real_engine_config_holds_the_slot_order(adapter: None, tiny_llama: Path) -> None:
    """What ``vllm serve --speculative-config`` builds: the draft config every runner
    reads holds the ids in slot order; an id past the last layer stops it."""
    last = servable_aux_ids("LlamaForCausalLM", 4, _installed()).high  # 3 on 0.17
    config = extract_engine_config(tiny_llama, ids=(last, 2, 2))
    assert getattr(config.speculative_config.draft_model_config.hf_config, IDS) == [2, last]
    with pytest.raises(Exception, match="id 9 \\(position 1\\) cannot be served"):
        extract_engine_config(tiny_llama, ids=(1, 9))
