"""A vLLM general plugin that registers vLLM's predictable test model of this folder
(predictable_llama.PredictableLlamaForCausalLM) in every vLLM process, for the copy of
test_extraction.py beside it: vLLM 0.22.0's CPU platform spawns its workers, where the test's
in-process ``ModelRegistry.register_model`` does not reach, and 0.22.0 has no
``model_class_overrides``. Found through speccompat_upstream_predictable-0.0.0.dist-info (its
entry_points.txt) while this folder is on ``sys.path``, as the test module puts it on
``PYTHONPATH``; vLLM's own tests later did the same with their vllm_add_predictable_models
plugin. Written by speccompat, not vLLM's.
"""

from __future__ import annotations

ARCH = "PredictableLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, f"predictable_llama:{ARCH}")
