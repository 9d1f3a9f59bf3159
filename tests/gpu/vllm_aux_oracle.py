"""vLLM's own forward as the reference for the aux hidden states of models that have no HF
transformers implementation (vLLM 0.34.0's Kimi-K3 and DeepSeek-V4 stacks under
``vllm/models/``). Run by tests/gpu/test_gpu_new_architectures.py in a process of its own:

    python tests/gpu/vllm_aux_oracle.py REQUEST.json OUT.pt

``REQUEST.json``: ``{"model": DIR, "arch": "kimi_k3" | "deepseek_v4", "prompts": [[ids]],
"aux_ids": [ids], "engine": {LLM keyword arguments}}``. One ``vllm.LLM`` (eager, in-process
engine, no speculative method: the capture path under test is not involved) runs each prompt
alone with ``max_tokens=1`` while forward hooks on the decoder layers compute, from each
layer's own inputs and outputs, what the model's EAGLE-3 capture defines:

- Kimi-K3 (``KimiLinearModel.forward``, vllm/models/kimi_k3/nvidia/model.py): id 0 is the
  embeddings; id k >= 1 is taken after layer k - 1 as ``hidden_states + residual`` or, with
  attention residuals (``attn_res_block_size``), ``_capture_aux_hidden_stream``: by default
  (``VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=0``, "prefix_only") ``prefix_sum + pending_mlp_out``, the
  block's partial sum; with the variable set, the AttnRes mix of the blocks that layer k (or
  the output head, for id N) reads, without its norm: the layer's pre-norm input. Here
  ``default`` holds the former and ``layer_input`` the latter (the same without AttnRes).
- DeepSeek-V4 (``DeepseekV4Model.forward``, vllm/models/deepseek_v4/nvidia/model.py): ids are
  taken only after layer k - 1 (``if idx + 1 in self.aux_hidden_state_layers``), as
  ``mhc_post_tilelang(hidden_states, residual, post_mix, res_mix).mean(dim=1)``: the mean of the
  hc_mult mHC residual streams. Id 0 is never captured; ``default[0]`` here is the embeddings,
  for reference only.

Besides the hooks, the model's own capture runs too: the aux ids are set on the decoder stack
(``_set_aux_hidden_state_layers``, as ``set_eagle3_aux_hidden_state_layers`` does) and a hook on
the stack takes the ``(hidden_states, aux_hidden_states)`` it returns after the whole forward
(what the extract_hidden_states speculator stacks) and hands vLLM's runner the plain tensor.
``OUT.pt`` holds, per prompt, ``default``/``layer_input`` ({id: [tokens, hidden]}), ``captured``
(the model's list), ``final`` (the stack's returned state: pre-norm for Kimi-K3, normed for
DeepSeek-V4), ``final_prenorm`` (DeepSeek-V4: the input of its final norm), plus the engine's
facts (parameters that look unloaded, the GPU, kernel packages found).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the hooks live in this process
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ["SPECCOMPAT_DISABLE"] = "1"  # the reference is vLLM alone

_RECORDS: list[dict[str, Any]] = []


def _stack(model: Any) -> Any:
    from vllm.model_executor.models.interfaces import EagleModelMixin

    for module in model.modules():
        if isinstance(module, EagleModelMixin) and hasattr(module, "layers"):
            return module
    raise RuntimeError(f"no EagleModelMixin decoder stack in {type(model).__name__}")


def _new_record(positions: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"positions": positions.detach().clone(), "default": {},
                              "layer_input": {}}
    _RECORDS.append(record)
    return record


def _install_kimi_k3(model: Any, aux_ids: list[int]) -> str:
    from vllm.models.kimi_k3.nvidia.ops import attn_res

    stack = _stack(model)
    layers = stack.layers
    n = len(layers)
    use_attn_res = bool(getattr(stack, "use_attn_res", False))

    def mix(partial: Any, blocks: Any, norm: Any, proj: Any, num_blocks: int) -> Any:
        return attn_res(partial, None, blocks, norm.weight, proj.weight.squeeze(0), None,
                        num_blocks=num_blocks, block_write_idx=-1,
                        eps=norm.variance_epsilon, output_norm_eps=0.0)

    def before(k: int) -> Any:
        def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if k == 0:
                _new_record(kwargs["positions"])
            record = _RECORDS[-1]
            hidden, residual = kwargs.get("hidden_states"), kwargs.get("residual")
            if use_attn_res:
                prefix = kwargs["prefix_sum"]
                partial = prefix.clone() if hidden is None else prefix + hidden
                stream = partial.clone() if k == 0 else mix(
                    partial, residual, module.self_attention_res_norm,
                    module.self_attention_res_proj, module.prev_valid_blocks)
            else:
                partial = hidden.clone() if residual is None else hidden + residual
                stream = partial
            record["default"][k] = partial
            record["layer_input"][k] = stream
        return hook

    def after_last(module: Any, args: Any, output: Any) -> None:
        hidden, prefix, residual = output
        record = _RECORDS[-1]
        if use_attn_res:
            partial = prefix + hidden
            stream = mix(partial, residual, stack.output_attn_res_norm,
                         stack.output_attn_res_proj, stack.num_attn_res_blocks)
        else:
            partial = hidden + residual
            stream = partial
        record["default"][n] = partial
        record["layer_input"][n] = stream

    for k, layer in enumerate(layers):
        layer.register_forward_pre_hook(before(k), with_kwargs=True)
    layers[n - 1].register_forward_hook(after_last)
    _capture_stack_output(stack, aux_ids)
    return f"KimiLinearModel: {n} layers, attn_res={use_attn_res}"


def _install_deepseek_v4(model: Any, aux_ids: list[int]) -> str:
    from vllm.model_executor.kernels.mhc.tilelang import mhc_post_tilelang

    stack = _stack(model)
    layers = stack.layers

    def first(module: Any, args: Any) -> None:
        record = _new_record(args[1])
        x = args[0]
        record["default"][0] = (x if x.dim() == 2 else x.float().mean(dim=1).to(x.dtype)).clone()

    def after(k: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            hidden, residual, post_mix, res_mix = output
            state = mhc_post_tilelang(hidden, residual, post_mix, res_mix).mean(dim=1)
            _RECORDS[-1]["default"][k + 1] = state
        return hook

    def final_norm(module: Any, args: Any) -> None:
        _RECORDS[-1]["final_prenorm"] = args[0].detach().clone()

    layers[0].register_forward_pre_hook(first)
    for k, layer in enumerate(layers):
        layer.register_forward_hook(after(k))
    stack.norm.register_forward_pre_hook(final_norm)
    _capture_stack_output(stack, aux_ids)
    return f"DeepseekV4Model: {len(layers)} layers, hc_mult={stack.hc_mult}"


def _capture_stack_output(stack: Any, aux_ids: list[int]) -> None:
    """The model's own capture: aux layers set on the stack, its ``(hidden, aux)`` taken and
    the plain hidden states handed on (the runner asked for none)."""
    stack._set_aux_hidden_state_layers(tuple(aux_ids))

    def hook(module: Any, args: Any, output: Any) -> Any:
        record = _RECORDS[-1] if _RECORDS else {}
        if isinstance(output, tuple):
            hidden, aux = output
            record["captured"] = [t.detach().clone() for t in aux]
            record["final"] = hidden.detach().clone()
            return hidden
        record["final"] = output.detach().clone()
        record["captured"] = []
        return None

    stack.register_forward_hook(hook)


def _install(model: Any, arch: str, aux_ids: list[int]) -> str:
    if arch == "kimi_k3":
        return _install_kimi_k3(model, aux_ids)
    if arch == "deepseek_v4":
        return _install_deepseek_v4(model, aux_ids)
    raise ValueError(f"unknown arch {arch!r}")


def _suspicious_parameters(model: Any) -> list[str]:
    """Parameters that look never loaded: all one value, or NaN (a checkpoint name the loader
    did not map leaves the parameter as it was allocated; vLLM's loader does not say so for
    modules whose quant method post-processes weights, which includes unquantized ones)."""
    import torch

    found = []
    for name, param in model.named_parameters():
        data = param.detach()
        if data.numel() > 1 and bool((data == data.reshape(-1)[0]).all()):
            found.append(f"{name}: all {data.reshape(-1)[0].item()!r}")
        elif torch.is_floating_point(data) and bool(torch.isnan(data).any()):
            found.append(f"{name}: NaN")
    return found


def _take(model: Any) -> list[dict[str, Any]]:
    out = []
    for record in _RECORDS:
        item: dict[str, Any] = {}
        for key, value in record.items():
            if isinstance(value, dict):
                item[key] = {k: v.cpu() for k, v in value.items()}
            elif isinstance(value, list):
                item[key] = [v.cpu() for v in value]
            else:
                item[key] = value.cpu()
        out.append(item)
    _RECORDS.clear()
    return out


def _facts() -> dict[str, Any]:
    import importlib.util
    import shutil

    import torch
    import vllm

    modules = ("tilelang", "cutlass", "deep_gemm", "vllm.third_party.deep_gemm", "flashinfer",
               "vllm._flashmla_C", "vllm._flashkda_C", "quack", "tvm_ffi")
    found = {}
    for name in modules:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    return {"vllm": vllm.__version__, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "nvcc": shutil.which("nvcc"), "CUDA_HOME": os.environ.get("CUDA_HOME"),
            "modules": found}


def main(request_path: str, out_path: str) -> None:
    import torch
    from vllm import LLM, SamplingParams

    request = json.loads(Path(request_path).read_text())
    prompts: list[list[int]] = request["prompts"]
    aux_ids: list[int] = request["aux_ids"]
    engine = {"enforce_eager": True, "enable_prefix_caching": False, **request["engine"]}
    llm = LLM(model=request["model"], **engine)
    suspicious = llm.apply_model(_suspicious_parameters)[0]
    stack = llm.apply_model(lambda model: _install(model, request["arch"], aux_ids))[0]
    print(f"oracle: hooks on {stack}; aux ids {aux_ids}", flush=True)
    results = []
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for prompt in prompts:
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        records = llm.apply_model(_take)[0]
        want = torch.arange(len(prompt))
        chosen = [r for r in records
                  if r["positions"].numel() >= len(prompt)
                  and r["positions"][: len(prompt)].long().equal(want)]
        if not chosen:
            raise RuntimeError(f"no forward of the {len(prompt)}-token prompt among "
                               f"{[tuple(r['positions'].shape) for r in records]}")
        record, rows = chosen[0], len(prompt)
        results.append({
            key: ({k: v[:rows] for k, v in value.items()} if isinstance(value, dict)
                  else [v[:rows] for v in value] if isinstance(value, list)
                  else value[:rows])
            for key, value in record.items() if key != "positions"
        })
    torch.save({"request": request, "results": results, "suspicious": suspicious,
                "stack": stack, "facts": _facts()}, out_path)
    print(f"oracle: wrote {out_path}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
