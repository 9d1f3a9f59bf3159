"""Model Runner V2 and ``extract_hidden_states``: before vLLM 0.29 V2 never runs the method,
so the server path needs no V2 adapter there. A fact test, no adapter.

- 0.17-0.19 (V2 opt-in): V2's ``init_speculator`` raises NotImplementedError for it.
- 0.20-0.21: ``VllmConfig._validate_v2_model_runner`` refuses it (``VLLM_USE_V2_MODEL_RUNNER=1``).
- 0.22-0.28, where V2 is the default on CUDA: ``_get_v2_model_runner_unsupported_features``
  names it; the default case then runs the V1 runner with a warning and the forced case is
  a ValidationError at start-up. Seen on the H200 with 0.22.0, 0.23.0, 0.24.0, 0.25.0 and
  0.26.0 (docs/results/gpu-results.md). On the CPU build the forced case stops earlier, at
  "Model Runner V2 requires Triton", so the list is read here, not the refusal.
- 0.29+: V2 runs it through its own ``ExtractHiddenStatesSpeculator``; the V1 runner stays
  the CPU build's (no Triton backend), so V2 extraction is not run by these cells. 0.29-0.33's
  ``init_speculator`` names it; from 0.34.0 ``init_speculator`` builds the class that the
  method's ``SpeculatorConfig`` names (``speculator_config._CONFIG_BY_METHOD``).

Read from the VllmConfig ``vllm serve`` builds for a tiny Llama asking for the method, with
speccompat's plugin off (nothing here is patched); the 0.17-0.19 rule and V2's own
speculator from 0.29 from the source, so contract-only cells check those too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speccompat.targets import module_source, source_def
from support import extract_engine_config, requires_vllm, vllm_in

pytestmark = requires_vllm
METHOD = "speculative method 'extract_hidden_states'"
V2_SPECULATORS = "vllm.v1.worker.gpu.spec_decode"


@pytest.fixture(scope="module")
def engine_config(tiny_llama: Path) -> Any:
    return extract_engine_config(tiny_llama)


@vllm_in(">=0.17.0,<0.20.0", "extract_hidden_states came with vLLM 0.17.0; 0.20.0 adds "
         "VllmConfig._validate_v2_model_runner")
def test_raw_v2_speculator_refuses_it_before_0_20() -> None:
    # Read from the source, so that contract-only cells (no model built) check it too.
    init = source_def(V2_SPECULATORS, "init_speculator")
    use_eagle = source_def("vllm.config.speculative", "SpeculativeConfig.use_eagle")
    assert init is not None and use_eagle is not None
    assert "use_eagle()" in init.text and "raise NotImplementedError" in init.text
    assert "extract_hidden_states" not in init.text + use_eagle.text


@vllm_in(">=0.20.0,<0.22.0", "0.22.0 moves the check into a list of unsupported features")
def test_raw_v2_refuses_it_in_0_20_and_0_21(engine_config: Any) -> None:
    with pytest.raises(ValueError, match=METHOD):
        engine_config._validate_v2_model_runner()


@vllm_in(">=0.22.0,<0.29.0", "before 0.22 V2 is opt-in only; 0.29 runs the method on V2")
def test_raw_v2_leaves_it_to_v1_from_0_22_to_0_28(engine_config: Any) -> None:
    import inspect

    from vllm.config import VllmConfig

    assert METHOD in engine_config._get_v2_model_runner_unsupported_features()
    # The forced case raises from the same list the default choice reads ("... does not yet
    # support ...; using the V1 model runner instead").
    forced = inspect.getsource(VllmConfig._validate_v2_model_runner)
    assert "self._get_v2_model_runner_unsupported_features()" in forced and "raise" in forced


@vllm_in(">=0.29.0", "before 0.29 V2 does not run the method (the tests above)")
def test_raw_v2_runs_it_from_0_29(engine_config: Any) -> None:
    assert METHOD not in engine_config._get_v2_model_runner_unsupported_features()


@vllm_in(">=0.29.0,<0.34.0", "before 0.29 V2's init_speculator knows no "
         "extract_hidden_states; from 0.34.0 it names no speculator (the test below)")
def test_raw_v2_has_its_own_speculator_for_it_from_0_29() -> None:
    init = source_def(V2_SPECULATORS, "init_speculator")
    assert init is not None and "ExtractHiddenStatesSpeculator" in init.text
    assert module_source(f"{V2_SPECULATORS}.extract_hidden_states") is not None


@vllm_in(">=0.34.0", "up to 0.33 init_speculator names ExtractHiddenStatesSpeculator itself")
def test_raw_v2_builds_the_speculator_its_method_config_names_from_0_34() -> None:
    """0.34.0: ``init_speculator`` builds ``speculative_config.speculator_config
    .speculator_class``; the config of ``extract_hidden_states`` names V2's own
    ``ExtractHiddenStatesSpeculator`` and says it uses aux hidden states (what makes V2's
    ``load_model`` set the model's aux layers). Config modules import no speculator, so
    this reads the real tables on a machine without CUDA."""
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu.spec_decode import speculator_config

    init = source_def(V2_SPECULATORS, "init_speculator")
    assert init is not None and "speculator_config.speculator_class" in init.text
    config = resolve_obj_by_qualname(
        speculator_config._CONFIG_BY_METHOD["extract_hidden_states"])
    assert issubclass(config, speculator_config.SpeculatorConfig)
    assert config.base_method == "extract_hidden_states"
    assert config.speculator_class == (
        f"{V2_SPECULATORS}.extract_hidden_states.ExtractHiddenStatesSpeculator")
    assert "def uses_aux_hidden_states" in (module_source(config.__module__) or "")
    speculator = module_source(f"{V2_SPECULATORS}.extract_hidden_states")
    assert speculator is not None and "class ExtractHiddenStatesSpeculator(" in speculator
