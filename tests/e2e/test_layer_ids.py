"""Layer-id conventions against HF transformers on a tiny fp32 Llama (no vLLM started).

Old speculators id k is the output of decoder layer k; vLLM aux id k + 1 is the input of
layer k + 1; the same tensor, so the comparisons are exact (``torch.equal``). Aux id N is
the input of the final norm. ``output_hidden_states[N]`` has that norm applied, which the
builder's non-unit norm weights make visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from speccompat import (
    LayerIdConvention,
    LayerIdError,
    default_layer_ids,
    hf_hidden_states_index,
    to_speculators_ids,
    to_vllm_aux_ids,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

OUT = LayerIdConvention.LAYER_OUTPUT
IN = LayerIdConvention.LAYER_INPUT
NUM_LAYERS = 4
LENGTHS = [1, 5, 17, 64]


@dataclass
class Capture:
    """One forward pass: what each layer took and gave, the final norm's input, HF's list."""

    layer_inputs: list[Any] = field(default_factory=list)
    layer_outputs: list[Any] = field(default_factory=list)
    norm_input: Any = None
    norm_output: Any = None
    hidden_states: tuple[Any, ...] = ()

    def aux(self, aux_id: int) -> Any:
        """The state vLLM aux id ``aux_id`` names: input of that layer, or of the norm."""
        return self.layer_inputs[aux_id] if aux_id < NUM_LAYERS else self.norm_input


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    value = args[0] if args else kwargs["hidden_states"]
    assert isinstance(value, torch.Tensor)
    return value.detach().clone()


@pytest.fixture(scope="module")
def captures(models_dir: Path) -> list[Capture]:
    from transformers import AutoModelForCausalLM

    import tiny_models

    path = tiny_models.build_llama(models_dir / "llama-fp32", num_layers=NUM_LAYERS,
                                   dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    assert len(model.model.layers) == NUM_LAYERS == model.config.num_hidden_layers
    current = Capture()

    def pre_hook(index: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            current.layer_inputs[index] = _first_tensor(args, kwargs)
        return hook

    def post_hook(index: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            value = output[0] if isinstance(output, tuple) else output
            current.layer_outputs[index] = value.detach().clone()
        return hook

    def norm_pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        current.norm_input = _first_tensor(args, kwargs)

    def norm_hook(module: Any, args: Any, output: Any) -> None:
        current.norm_output = output.detach().clone()

    handles = []
    for index, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_pre_hook(pre_hook(index), with_kwargs=True))
        handles.append(layer.register_forward_hook(post_hook(index)))
    handles.append(model.model.norm.register_forward_pre_hook(norm_pre_hook, with_kwargs=True))
    handles.append(model.model.norm.register_forward_hook(norm_hook))
    results = []
    try:
        with torch.no_grad():
            for prompt in tiny_models.make_prompts(tiny_models.VOCAB_SIZE, LENGTHS):
                current = Capture([None] * NUM_LAYERS, [None] * NUM_LAYERS)
                out = model(input_ids=torch.tensor([prompt]), output_hidden_states=True,
                            use_cache=False)
                current.hidden_states = tuple(h.detach().clone() for h in out.hidden_states)
                results.append(current)
    finally:
        for handle in handles:
            handle.remove()
    for capture in results:
        assert all(t is not None for t in capture.layer_inputs + capture.layer_outputs)
        assert capture.norm_input is not None
        assert len(capture.hidden_states) == NUM_LAYERS + 1
    return results


def test_output_of_layer_k_is_aux_id_k_plus_1(captures: list[Capture]) -> None:
    old_ids = list(range(NUM_LAYERS))
    aux_ids = to_vllm_aux_ids(old_ids, NUM_LAYERS)
    assert aux_ids == [1, 2, 3, 4]
    for capture in captures:
        for k, aux in zip(old_ids, aux_ids, strict=True):
            assert torch.equal(capture.layer_outputs[k], capture.aux(aux)), (k, aux)
            # ... and not aux id k: an off-by-one would be caught.
            assert not torch.allclose(capture.layer_outputs[k], capture.aux(k)), k
        # The last layer's output is the final norm's input: aux id N.
        assert torch.equal(capture.layer_outputs[NUM_LAYERS - 1], capture.norm_input)


def test_aux_ids_back_to_old_ids_select_the_same_tensors(captures: list[Capture]) -> None:
    aux_ids = list(range(1, NUM_LAYERS + 1))
    for capture in captures:
        for aux, k in zip(aux_ids, to_speculators_ids(aux_ids, NUM_LAYERS), strict=True):
            assert torch.equal(capture.aux(aux), capture.layer_outputs[k]), (aux, k)
    with pytest.raises(LayerIdError, match="embeddings"):
        to_speculators_ids([0], NUM_LAYERS)


def test_converted_defaults_select_the_old_default_layers(captures: list[Capture]) -> None:
    old = default_layer_ids(NUM_LAYERS, OUT)
    assert old == [2, 2, 1, 3]
    for capture in captures:
        for k, aux in zip(old, to_vllm_aux_ids(old, NUM_LAYERS), strict=True):
            assert torch.equal(capture.layer_outputs[k], capture.aux(aux))


def test_hf_index_picks_the_matching_entry(captures: list[Capture]) -> None:
    for capture in captures:
        hs = capture.hidden_states
        for k in range(NUM_LAYERS - 1):  # every old id except the last layer's
            index = hf_hidden_states_index(k, OUT, num_layers=NUM_LAYERS)
            assert index == k + 1
            assert torch.equal(hs[index], capture.layer_outputs[k]), k
        for aux in range(NUM_LAYERS):  # every aux id except N (0 is the embeddings)
            index = hf_hidden_states_index(aux, IN, num_layers=NUM_LAYERS)
            assert index == aux
            assert torch.equal(hs[index], capture.aux(aux)), aux


def test_hf_last_entry_is_not_the_final_pre_norm_state(captures: list[Capture]) -> None:
    for capture in captures:
        last = capture.hidden_states[NUM_LAYERS]
        assert torch.equal(last, capture.norm_output)  # the final norm applied ...
        assert not torch.allclose(last, capture.norm_input)  # ... so not what both capture
        assert not any(torch.equal(h, capture.norm_input) for h in capture.hidden_states)
    for layer_id, conv in ((NUM_LAYERS - 1, OUT), (NUM_LAYERS, IN)):
        with pytest.raises(LayerIdError, match="final norm applied"):
            hf_hidden_states_index(layer_id, conv, num_layers=NUM_LAYERS)
