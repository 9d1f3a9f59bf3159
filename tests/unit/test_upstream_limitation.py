"""The refusal ``vllm.extract_hidden_states_layer_ids`` raises where vLLM's own
``ExtractHiddenStatesConfig.__init__`` cannot build the draft config because transformers'
generic layer-type validation rejects the target's layer types (DeepSeek-V4 on vLLM 0.34.0
with transformers 5.22.2; the upstream fact is pinned in
tests/contract/facts/test_deepseek_v4_extract_config.py)."""

from __future__ import annotations

import functools
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from speccompat.errors import SpeccompatError, UpstreamLimitationError
from speccompat.server.adapters import extract_hidden_states_layer_ids as adapter

# What transformers 5.22.2 raises, chained as huggingface_hub's strict dataclass does.
REFUSAL = ("The `mlp_layer_types` entries must be in ('sparse', 'dense') but got "
           "['hash_moe', 'moe', 'moe', 'moe']")


class StrictDataclassClassValidationError(Exception):
    """Stands in for huggingface_hub.errors.StrictDataclassClassValidationError (an
    Exception, not a ValueError)."""


def _upstream_error() -> BaseException:
    try:
        try:
            raise ValueError(REFUSAL)
        except ValueError as cause:
            raise StrictDataclassClassValidationError(
                "Class validation error for validator 'validate_layer_type':\n"
                f"    ValueError: {REFUSAL}") from cause
    except StrictDataclassClassValidationError as error:
        return error


V4 = SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], num_hidden_layers=4)


def test_the_message_says_what_was_found_why_and_what_to_do() -> None:
    error = adapter.upstream_limitation(V4, _upstream_error(), vllm_version="0.34.0",
                                        transformers_version="5.22.2")
    assert isinstance(error, UpstreamLimitationError) and isinstance(error, SpeccompatError)
    text = str(error)
    # what was found
    assert "vLLM 0.34.0's extract_hidden_states cannot build its draft config for " \
        "DeepseekV4ForCausalLM under transformers 5.22.2" in text
    assert f"validate_layer_type: {REFUSAL}" in text
    # an upstream limitation, named with the versions
    assert "This is an upstream limitation of vLLM 0.34.0's extract_hidden_states with " \
        "DeepseekV4ForCausalLM under transformers 5.22.2" in text
    # what to do
    assert "speccompat has no workaround for it yet" in text
    assert "track the upstream issue" in text
    assert error.found.startswith("vLLM 0.34.0") and error.advice.startswith("speccompat has")


def test_a_config_dict_names_its_architecture_too() -> None:
    error = adapter.upstream_limitation({"architectures": ["DeepseekV41ForCausalLM"]},
                                        ValueError(REFUSAL), vllm_version="0.34.0",
                                        transformers_version="5.22.2")
    assert error is not None and "for DeepseekV41ForCausalLM under" in str(error)


@pytest.mark.parametrize("other", [ValueError("`num_hidden_layers` (4) must be equal"),
                                   TypeError("unexpected keyword"), AssertionError()])
def test_other_errors_are_not_taken_for_the_limitation(other: BaseException) -> None:
    assert adapter.upstream_limitation(V4, other, vllm_version="0.34.0",
                                       transformers_version="5.22.2") is None


def test_the_error_survives_pickling() -> None:
    error = adapter.upstream_limitation(V4, _upstream_error(), vllm_version="0.34.0",
                                        transformers_version="5.22.2")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is UpstreamLimitationError and str(again) == str(error)
    assert again.advice == error.advice  # type: ignore[union-attr]


@pytest.fixture
def versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper reads the installed versions, which the unit venv does not have (and
    unit tests must not import vLLM): give them."""
    monkeypatch.setattr(adapter, "upstream_limitation",
                        functools.partial(adapter.upstream_limitation, vllm_version="0.34.0",
                                          transformers_version="5.22.2"))


def test_the_wrapped_init_raises_it_with_the_original_chained(versions: None) -> None:
    upstream = _upstream_error()

    def init(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> None:
        raise upstream

    wrapped = adapter._checked(init)
    with pytest.raises(UpstreamLimitationError) as error:
        wrapped(object(), V4, eagle_aux_hidden_state_layer_ids=[1, 2])
    assert error.value.__cause__ is upstream
    assert "vLLM 0.34.0" in str(error.value) and "transformers 5.22.2" in str(error.value)


def test_the_wrapped_init_lets_any_other_error_through(versions: None) -> None:
    def init(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("method")

    with pytest.raises(AssertionError, match="method"):
        adapter._checked(init)(object(), V4, method="eagle3")
