"""The independent reference: HF transformers on the same random weights."""

from __future__ import annotations

from pathlib import Path

import torch


def layer_outputs(model_dir: Path, prompts: list[list[int]]) -> list[list[torch.Tensor]]:
    """Per prompt, the output of every decoder layer before the final norm, in float32.

    Taken with forward hooks rather than ``output_hidden_states``, whose last
    entry has the final norm applied; for the other layers the two agree
    (``hidden_states[k + 1]``), which the e2e tests check as well.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    captured: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: object, output: object) -> None:
        value = output[0] if isinstance(output, tuple) else output
        assert isinstance(value, torch.Tensor)
        captured.append(value[0].detach().clone())

    handles = [layer.register_forward_hook(hook) for layer in model.model.layers]
    results = []
    try:
        with torch.no_grad():
            for prompt in prompts:
                captured.clear()
                model(input_ids=torch.tensor([prompt]), use_cache=False)
                results.append(list(captured))
    finally:
        for handle in handles:
            handle.remove()
    return results


def relative_errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(mean, max) absolute difference, relative to the reference's mean / max magnitude."""
    diff = (got.float() - want.float()).abs()
    scale = want.float().abs()
    return (float(diff.mean() / max(scale.mean().item(), 1e-6)),
            float(diff.max() / max(scale.max().item(), 1e-6)))


def token_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per token: largest absolute difference relative to the reference's largest magnitude."""
    diff = (got.float() - want.float()).abs().amax(dim=-1)
    return diff / max(want.float().abs().max().item(), 1e-6)


def layer_errors(
    results: list[dict[str, list[torch.Tensor]]],
    reference: list[list[torch.Tensor]],
    layer_ids: list[int],
    token_threshold: float = 0.15,
) -> list[tuple[int, int, float, float, int]]:
    """Per prompt and requested layer of a generator's ``results`` against ``reference``
    (:func:`layer_outputs`): (layer, tokens, mean and max relative error, tokens whose
    :func:`token_errors` exceed ``token_threshold``)."""
    rows = []
    for result, want in zip(results, reference, strict=True):
        states = result["hidden_states"]
        assert len(states) == len(layer_ids)
        for layer, got in zip(layer_ids, states, strict=True):
            assert got.shape == want[layer].shape, (layer, got.shape, want[layer].shape)
            mean, worst = relative_errors(got, want[layer])
            off = int((token_errors(got, want[layer]) > token_threshold).sum())
            rows.append((layer, got.shape[0], mean, worst, off))
    return rows


def layer_inputs(model_dir: Path, prompts: list[list[int]]) -> list[list[torch.Tensor]]:
    """Per prompt, the input of every decoder layer and then the final pre-norm state, in
    float32: the server path's ids 0..N (id 0 the embeddings, id N the input of the final
    norm), which are ``output_hidden_states[0..N-1]`` and :func:`layer_outputs`' last."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    results = []
    with torch.no_grad():
        for prompt in prompts:
            out = model(input_ids=torch.tensor([prompt]), use_cache=False,
                        output_hidden_states=True)
            states = [h[0].detach().clone() for h in out.hidden_states[:-1]]
            results.append(states)
    for states, outputs in zip(results, layer_outputs(model_dir, prompts), strict=True):
        states.append(outputs[-1])
    return results
