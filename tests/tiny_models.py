"""Tiny random-weight models built locally for tests (no model hub needed).

Every builder is deterministic in its arguments and idempotent: a folder that already
holds a complete model built with the same parameters is returned as it is.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

#: Special tokens; they take the first ids of the vocabulary, in this order.
SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(len(SPECIAL_TOKENS))
#: Total vocabulary size of the tokenizer (and of every model built here).
VOCAB_SIZE = 512
#: Bump when the output of a builder changes, so cached folders are rebuilt.
BUILDER_VERSION = 1
MARKER = "tiny_model.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def build_tokenizer(path: Path, extra_special: tuple[str, ...] = ()) -> None:
    """Write a WordLevel fast tokenizer (words ``t0`` .. ``t507``) to ``path``.

    ``extra_special`` tokens (Kimi's media tokens) replace the last words, keeping their ids.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    num_words = VOCAB_SIZE - len(vocab) - len(extra_special)
    vocab.update({f"t{i}": len(SPECIAL_TOKENS) + i for i in range(num_words)})
    vocab.update({tok: VOCAB_SIZE - len(extra_special) + i for i, tok in enumerate(extra_special)})
    extra = {"additional_special_tokens": list(extra_special)} if extra_special else {}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
        **extra,
    )
    tok.save_pretrained(str(path))


def _is_complete(path: Path, params: dict[str, Any]) -> bool:
    marker = path / MARKER
    if not all((path / name).is_file() for name in (MARKER, *_REQUIRED_FILES)):
        return False
    try:
        return bool(json.loads(marker.read_text()) == params)
    except (OSError, ValueError):
        return False


def _build_cached(path: Path, params: dict[str, Any], make_config: Callable[[], Any]) -> Path:
    """Build into a temporary sibling folder, then move it into place (safe across processes)."""
    path = Path(path)
    if _is_complete(path, params):
        return path
    from transformers import AutoModelForCausalLM

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    config = make_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(params["seed"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(params["seed"] + 1)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("norm.weight"):  # not all-ones, so a skipped norm shows up
                tensor.copy_(1.0 + 0.1 * torch.randn(tensor.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):  # routing depends on the bias
                tensor.copy_(0.2 * torch.randn(tensor.shape, generator=gen))
    model = model.to(getattr(torch, params["dtype"]))
    model.save_pretrained(str(tmp), safe_serialization=True)
    build_tokenizer(tmp)
    return _publish(tmp, path, params)


def _publish(tmp: Path, path: Path, params: dict[str, Any]) -> Path:
    """Mark the finished build ``tmp`` complete and move it to ``path``."""
    (tmp / MARKER).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    if path.exists():
        if _is_complete(path, params):  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        shutil.rmtree(path)
    try:
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _is_complete(path, params):
            raise
    return path


def build_llama(
    path: Path, *, num_layers: int = 4, hidden: int = 64, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Build (or reuse) a random-weight ``LlamaForCausalLM`` with 4 heads / 2 KV heads.

    head_dim is at least 32: vLLM's CPU attention backend supports only head sizes
    32, 64, 80, ... (16 fails at the first forward with "Unsupported CPU attention
    configuration: head_dim=16").
    """
    params: dict[str, Any] = {
        "arch": "llama",
        "builder_version": BUILDER_VERSION,
        "num_layers": num_layers,
        "hidden": hidden,
        "dtype": dtype,
        "seed": seed,
    }

    def make_config() -> PretrainedConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=max(32, hidden // 4),
            max_position_embeddings=4096,
            initializer_range=0.2,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            dtype=dtype,
        )

    return _build_cached(path, params, make_config)


def build_qwen3(path: Path, *, num_layers: int = 4, hidden: int = 128,
                dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Build (or reuse) a random-weight ``Qwen3ForCausalLM`` (q/k norms, 4 heads / 2 KV
    heads of 64): a second stack on ``EagleModelMixin`` beside Llama, for the GPU tests."""
    params: dict[str, Any] = {"arch": "qwen3", "builder_version": BUILDER_VERSION,
                              "num_layers": num_layers, "hidden": hidden, "dtype": dtype,
                              "seed": seed}

    def make_config() -> PretrainedConfig:
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, max_position_embeddings=4096, initializer_range=0.2,
            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=BOS_ID,
            eos_token_id=EOS_ID, pad_token_id=PAD_ID, dtype=dtype)

    return _build_cached(path, params, make_config)


def build_deepseek_v3(
    path: Path,
    *,
    num_layers: int = 4,
    hidden: int = 64,
    dtype: str = "bfloat16",
    seed: int = 0,
    llama_4_scaling: dict[str, Any] | None = None,
) -> Path:
    """Build (or reuse) a random-weight ``DeepseekV3ForCausalLM`` (MLA + noaux_tc MoE).

    Layer 0 is dense, later layers are MoE (4 routed experts, top-2, 1 shared expert).
    ``llama_4_scaling`` (e.g. ``{"original_max_position_embeddings": 16, "beta": 0.5}``)
    is written to config.json; vLLM applies it but HF transformers ignores it, so HF parity
    only holds for positions below ``original_max_position_embeddings``.

    vLLM CPU needs ``VLLM_MLA_DISABLE=1`` (no MLA backend on CPU), and, for HF parity, the
    native RoPE: ``compilation_config={"custom_ops": ["all", "-rotary_embedding"]}``. The
    CPU rotary kernel (vLLM 0.16.0) reads heads as ``size(-1) // head_size`` and so
    rotates the wrong rows of the 3-D ``[tokens, heads, dim]`` query that the non-MLA
    DeepSeek attention passes it.
    """
    params: dict[str, Any] = {
        "arch": "deepseek_v3",
        "builder_version": BUILDER_VERSION,
        "num_layers": num_layers,
        "hidden": hidden,
        "dtype": dtype,
        "seed": seed,
        "llama_4_scaling": llama_4_scaling,
    }

    def make_config() -> PretrainedConfig:
        from transformers import DeepseekV3Config

        extra: dict[str, Any] = {}
        if llama_4_scaling is not None:
            extra["llama_4_scaling"] = dict(llama_4_scaling)
        return DeepseekV3Config(
            vocab_size=VOCAB_SIZE,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden // 2,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=16,
            v_head_dim=16,
            max_position_embeddings=4096,
            rope_scaling=None,
            initializer_range=0.2,
            tie_word_embeddings=False,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            num_nextn_predict_layers=0,
            dtype=dtype,
            **extra,
        )

    return _build_cached(path, params, make_config)


#: Kimi-K2.5's media tokens (real ids 163602..163605); here the last four ids, pad last.
KIMI_MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>")
KIMI_MEDIA_PAD_ID = VOCAB_SIZE - 1
_KIMI_PROCESSOR_FILE = "kimi_k25_vision_processing.py"
_KIMI_CONFIG_FILE = "configuration_kimi_k25.py"
# The real checkpoint ships its config class as remote code; speculators' generator reads
# num_hidden_layers through AutoConfig(trust_remote_code=True). vLLM uses its own class.
_KIMI_CONFIG_SRC = '''from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**{k: v for k, v in text_config.items()
                                              if k != "model_type"})
        self.text_config = text_config
        self.vision_config = vision_config or {}
        super().__init__(**kwargs)
'''
_KIMI_PROCESSOR_SRC = '''"""Tiny stand-in for Kimi-K2.5's image processor."""
import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class KimiK25VisionProcessor(BaseImageProcessor):
    model_type = "kimi_k25"

    def __init__(self, media_proc_cfg=None, **kwargs):
        super().__init__(**kwargs)
        self.media_proc_cfg = dict(media_proc_cfg or {})
        self.num_frames_per_chunk = self.media_proc_cfg["temporal_merge_kernel_size"]

    def media_tokens_calculator(self, media):
        cfg = self.media_proc_cfg
        return (cfg["image_side"] // cfg["patch_size"] // cfg["merge_kernel_size"]) ** 2

    def preprocess(self, medias, return_tensors=None, **kwargs):
        medias = medias if isinstance(medias, list) else [medias]
        if not medias:
            return BatchFeature(data={}, tensor_type=return_tensors)
        side, p = self.media_proc_cfg["image_side"], self.media_proc_cfg["patch_size"]
        pixels, grids = [], []
        for media in medias:
            frames = media["video_chunk"] if media["type"] == "video_chunk" else [media["image"]]
            frames = [np.asarray(f.convert("RGB").resize((side, side))) for f in frames]
            x = (np.stack(frames).astype(np.float32) / 255.0 - 0.5) / 0.5
            t, n = x.shape[0], side // p
            x = x.reshape(t, n, p, n, p, 3).transpose(0, 1, 3, 5, 2, 4).reshape(-1, 3, p, p)
            pixels.append(torch.from_numpy(np.ascontiguousarray(x)))
            grids.append([t, n, n])
        data = {"pixel_values": torch.cat(pixels), "grid_thws": torch.tensor(grids)}
        return BatchFeature(data=data, tensor_type=return_tensors)
'''


def _kimi_vision_weights(vision: dict[str, Any], text_hidden: int, seed: int) -> dict[str, Any]:
    """Random float32 weights for every vision-tower and projector tensor vLLM loads."""
    h, mlp, p = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    side, merged, pos = vision["init_pos_emb_height"], h * 4, "vision_tower.patch_embed.pos_emb"
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p), f"{pos}.weight": (side, side, h),
        "mm_projector.proj.0.weight": (merged, merged),  # merge_kernel_size [2, 2]
        "mm_projector.proj.2.weight": (text_hidden, merged),
    }
    norms = ["vision_tower.encoder.final_layernorm", "mm_projector.pre_norm"]
    for i in range(vision["num_hidden_layers"]):
        block = f"vision_tower.encoder.blocks.{i}"
        norms += [f"{block}.norm0", f"{block}.norm1"]
        shapes.update({f"{block}.wqkv.weight": (3 * h, h), f"{block}.wo.weight": (h, h),
                       f"{block}.mlp.fc0.weight": (mlp, h), f"{block}.mlp.fc1.weight": (h, mlp)})
    shapes.update({f"{norm}.weight": (h,) for norm in norms})
    shapes.update({f"{n[:-7]}.bias": s[:1] for n, s in list(shapes.items()) if pos not in n})
    gen = torch.Generator().manual_seed(seed + 2)
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)  # norms near 1, so a skipped norm shows up
        out[name] = 1.0 + 0.1 * noise if name[:-7] in norms else 0.1 * noise
    return out


def build_kimi_k25(
    path: Path, *, num_layers: int = 4, hidden: int = 64, dtype: str = "bfloat16", seed: int = 0,
    text_model: Path | None = None,
) -> Path:
    """Build (or reuse) a random-weight ``KimiK25ForConditionalGeneration`` (vLLM >= 0.15).

    config.json has the real Kimi-K2.5 layout: ``model_type: kimi_k25``, a DeepseekV3
    ``text_config`` (``model_type: kimi_k2``), a one-block MoonViT ``vision_config`` (both the
    names vLLM reads and the real ``vt_*`` aliases), ``media_placeholder_token_id``. The
    language model is exactly :func:`build_deepseek_v3` with the same arguments, built into
    ``path / "text_only"`` and saved here under ``language_model.``: the HF reference for the
    text part is ``DeepseekV3ForCausalLM`` on :func:`kimi_text_reference` ``(path)``.

    The image processor is local remote code (``kimi_k25_vision_processing.py``; frames are
    resized to 56x56, 4 tokens each), which vLLM runs on a dummy image at startup even for
    text-only prompts: vLLM 0.15/0.16 load it with trust_remote_code forced on, 0.22 needs
    ``trust_remote_code=True``. The tokenizer's last four ids are Kimi's media tokens
    (``<|media_pad|>`` is ``KIMI_MEDIA_PAD_ID``). vLLM CPU settings as for
    :func:`build_deepseek_v3`. vLLM 0.15.x's CPU build loads it only with speccompat applied
    (vLLM 0.16.0 fixed both upstream): Kimi's ``__init__`` calls ``torch.cuda.current_device()``
    (adapter ``vllm.kimi_k25_cuda_current_device``) and its ``load_weights`` maps
    ``q_a_proj`` to ``fused_qkv_a_proj``, which the ``VLLM_MLA_DISABLE=1`` attention lacks
    (adapter ``vllm.kimi_k25_unfused_qkv_a_proj``).

    ``text_model`` replaces the built language model with a DeepseekV3 folder of width
    ``hidden`` (e.g. one with the real MLA head shapes the CUDA kernels need).
    """
    from safetensors.torch import load_file, save_file

    params: dict[str, Any] = {"arch": "kimi_k25", "builder_version": BUILDER_VERSION + 2,
                              "num_layers": num_layers, "hidden": hidden, "dtype": dtype,
                              "seed": seed, "text_model": str(text_model or "")}
    path = Path(path)
    if _is_complete(path, params):
        return path
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if text_model is not None:
        text_dir = Path(shutil.copytree(text_model, tmp / "text_only"))
    else:
        text_dir = build_deepseek_v3(tmp / "text_only", num_layers=num_layers, hidden=hidden,
                                     dtype=dtype, seed=seed)
    text_config = json.loads((text_dir / "config.json").read_text())
    text_config.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    size = {"num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 32,
            "intermediate_size": 64}
    vision: dict[str, Any] = {
        **size, **{f"vt_{k}": v for k, v in size.items()}, "patch_size": 14,
        "init_pos_emb_height": 4, "init_pos_emb_width": 4, "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed", "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger", "mm_hidden_size": 32, "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5, "text_hidden_size": hidden,
    }
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": text_config, "vision_config": vision, "ignore_index": -100,
        "media_placeholder_token_id": KIMI_MEDIA_PAD_ID, "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>", "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "tie_word_embeddings": False,
        "dtype": dtype, "auto_map": {"AutoConfig": f"{_KIMI_CONFIG_FILE[:-3]}.KimiK25Config"},
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / _KIMI_CONFIG_FILE).write_text(_KIMI_CONFIG_SRC)
    processor = {
        "auto_map": {"AutoImageProcessor": f"{_KIMI_PROCESSOR_FILE[:-3]}.KimiK25VisionProcessor"},
        # image_side is read by the local processor; the rest as in the real checkpoint,
        # scaled down, for vLLM's own fused processor (0.30+).
        "media_proc_cfg": {"patch_size": 14, "merge_kernel_size": 2, "image_side": 56,
                           "temporal_merge_kernel_size": 4, "image_mean": [0.5, 0.5, 0.5],
                           "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 16,
                           "patch_limit_on_one_side": 4, "in_patch_limit_each_frame": 16,
                           "in_patch_limit_video": 16, "fixed_output_tokens": None},
    }
    (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    (tmp / _KIMI_PROCESSOR_FILE).write_text(_KIMI_PROCESSOR_SRC)
    text_weights = load_file(text_dir / "model.safetensors")
    tensors = {f"language_model.{k}": v for k, v in text_weights.items()}
    for name, tensor in _kimi_vision_weights(vision, hidden, seed).items():
        tensors[name] = tensor.to(getattr(torch, dtype))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(tmp, extra_special=KIMI_MEDIA_TOKENS)
    return _publish(tmp, path, params)


def kimi_text_reference(path: Path) -> Path:
    """The ``DeepseekV3ForCausalLM`` folder with a :func:`build_kimi_k25` model's text weights."""
    return Path(path) / "text_only"


def hf_hidden_states(
    model_dir: Path, prompts: list[list[int]], *, dtype: torch.dtype = torch.float32
) -> list[tuple[torch.Tensor, ...]]:
    """Run HF transformers on each prompt alone and return its hidden states.

    Per prompt: a tuple of ``num_layers + 1`` tensors of shape ``[len(prompt), hidden]``.
    Index 0 is the embedding output and index ``k + 1`` the residual stream after decoder
    layer ``k``, except the LAST entry, which HF returns with the final norm applied
    (so compare vLLM layer ``k`` with index ``k + 1`` only for ``k < num_layers - 1``).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    out: list[tuple[torch.Tensor, ...]] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.long)
            res = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            out.append(tuple(h[0].detach().clone() for h in res.hidden_states))
    return out


def make_prompts(
    tokenizer_or_vocab_size: int | PreTrainedTokenizerBase, lengths: list[int], seed: int = 0
) -> list[list[int]]:
    """Deterministic random prompts of the given lengths, free of special tokens.

    An ``int`` is taken as the vocabulary size of a tokenizer from :func:`build_tokenizer`
    (special tokens first); a tokenizer is asked for its size and special ids.
    """
    if isinstance(tokenizer_or_vocab_size, int):
        size, special = tokenizer_or_vocab_size, set(range(len(SPECIAL_TOKENS)))
    else:
        size = len(tokenizer_or_vocab_size)
        special = set(tokenizer_or_vocab_size.all_special_ids)
    allowed = [i for i in range(size) if i not in special]
    rng = random.Random(seed)
    return [[rng.choice(allowed) for _ in range(n)] for n in lengths]


def build_qwen3_next(
    path: Path, *, num_key_value_heads: int = 2, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Build (or reuse) a random-weight ``Qwen3NextForCausalLM``, the hybrid verifier of
    speccompat issue #20 (model m1; m2 is ``num_key_value_heads=4``): 4 layers, linear
    attention (gated delta net) and full attention alternating, 4 routed experts, hidden
    256, vocabulary 1000 (the tokenizer's 512 words are its first ids). Every weight is
    drawn from ``normal_(0, 0.05)``, as in the issue.
    """
    params: dict[str, Any] = {
        "arch": "qwen3_next",
        "builder_version": BUILDER_VERSION,
        "num_key_value_heads": num_key_value_heads,
        "dtype": dtype,
        "seed": seed,
    }
    path = Path(path)
    if _is_complete(path, params):
        return path
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    config = Qwen3NextConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=num_key_value_heads, head_dim=128,
        partial_rotary_factor=0.25, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, dtype=dtype,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0, 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(tmp), safe_serialization=True)
    build_tokenizer(tmp)
    return _publish(tmp, path, params)


# vLLM 0.34.0's own model stacks (``vllm/models/kimi_k3``, ``vllm/models/deepseek_v4``): neither
# has an HF transformers model to build from, so the builders below write config.json and random
# safetensors under the checkpoint names vLLM 0.34.0's loaders expect (read from the wheel).


def _random_checkpoint(spec: dict[str, tuple[tuple[int, ...], str]], seed: int,
                       dtype: str) -> dict[str, torch.Tensor]:
    """Deterministic random tensors for ``{name: (shape, kind)}``, drawn in ``spec``'s order.

    Kinds: ``embed`` N(0, 1); ``linear`` N(0, 0.5 / sqrt(fan_in)) (the last dimension), so
    every layer moves the residual stream by a visible amount without blowing it up; ``norm``
    1 + 0.1 N(0, 1), so a skipped norm shows up; ``bias`` 0.2 N(0, 1); ``f32`` / ``f32norm``
    the same as ``linear`` / ``norm`` kept in float32 (parameters vLLM holds in float32);
    ``a_log`` log U(1, 16) in float32 (KDA's decay); ``sink`` 0.5 N(0, 1) in float32;
    ``hash:E`` an int32 table of distinct expert ids below E per row (DeepSeek-V4's hash
    routing).
    """
    gen = torch.Generator().manual_seed(seed)
    low = getattr(torch, dtype)
    out: dict[str, torch.Tensor] = {}
    for name, (shape, kind) in spec.items():
        fan_in = shape[-1] if shape else 1
        if kind.startswith("hash:"):
            experts = int(kind.split(":", 1)[1])
            rows = [torch.randperm(experts, generator=gen)[: shape[1]] for _ in range(shape[0])]
            out[name] = torch.stack(rows).to(torch.int32)
            continue
        noise = torch.randn(shape, generator=gen)
        if kind == "embed":
            value, keep32 = noise, False
        elif kind in ("linear", "f32"):
            value, keep32 = noise * (0.5 / fan_in**0.5), kind == "f32"
        elif kind in ("norm", "f32norm"):
            value, keep32 = 1.0 + 0.1 * noise, kind == "f32norm"
        elif kind == "bias":
            value, keep32 = 0.2 * noise, True
        elif kind == "a_log":
            value = torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen))
            keep32 = True
        elif kind == "sink":
            value, keep32 = 0.5 * noise, True
        else:
            raise ValueError(f"unknown tensor kind {kind!r} for {name}")
        out[name] = value.to(torch.float32 if keep32 else low).contiguous()
    return out


def _write_checkpoint(tmp: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                      extra_special: tuple[str, ...] = ()) -> None:
    from safetensors.torch import save_file

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(tmp, extra_special=extra_special)


#: Kimi-K3's decoder layout, scaled down (1-based layer numbers, as its config counts them).
KIMI_K3_KDA_LAYERS = (1, 2, 4, 5)
KIMI_K3_MLA_LAYERS = (3, 6)


def kimi_k3_text_config(*, num_layers: int = 6, hidden: int = 256,
                        attn_res_block_size: int | None = 2) -> dict[str, Any]:
    """``text_config`` of :func:`write_tiny_kimi_k3` (vLLM's ``KimiLinearConfig`` fields)."""
    kda = [n for n in KIMI_K3_KDA_LAYERS if n <= num_layers]
    full = [n for n in range(1, num_layers + 1) if n not in kda]
    return {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
        "vocab_size": VOCAB_SIZE, "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": num_layers, "num_attention_heads": 8, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
        # SiTU activation (Kimi-K3's; MegaMoE refuses anything else), its betas as b12x reads
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        # KDA: Kimi-K3's full-rank gate (KimiK3DeltaAttention), heads of 128 as the real model
        "linear_attn_config": {"kda_layers": kda, "full_attn_layers": full, "num_heads": 16,
                               "head_dim": 128, "short_conv_kernel_size": 4,
                               "use_full_rank_gate": True, "gate_lower_bound": -5.0},
        # MLA: NoPE-only, q-LoRA with the output gate, the real latent shapes (512 + 64)
        "q_lora_rank": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
        "mla_use_output_gate": True,
        # MoE from layer 1: latent routed experts, one shared expert, one expert group
        "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
        "moe_intermediate_size": hidden // 2, "routed_expert_hidden_size": hidden // 2,
        "latent_moe_use_norm": True, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
        # Attention residuals over blocks of layers
        "attn_res_block_size": attn_res_block_size,
        "num_nextn_predict_layers": 0, "dtype": "bfloat16",
    }


def _kimi_k3_tensor_spec(text: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor vLLM 0.34.0's ``KimiK3ForConditionalGeneration`` loads for the text model
    (the vision tower is left out: the GPU tests serve with ``--limit-mm-per-prompt
    '{"image": 0}'``, which builds none), under the names its ``load_weights`` maps."""
    h, v = text["hidden_size"], text["vocab_size"]
    kda = text["linear_attn_config"]
    kh, kd, kc = kda["num_heads"], kda["head_dim"], kda["short_conv_kernel_size"]
    proj = kh * kd
    nh, ql, kvl = text["num_attention_heads"], text["q_lora_rank"], text["kv_lora_rank"]
    rope, nope, vd = text["qk_rope_head_dim"], text["qk_nope_head_dim"], text["v_head_dim"]
    experts, inter = text["num_experts"], text["moe_intermediate_size"]
    latent, shared = text["routed_expert_hidden_size"], text["num_shared_experts"]
    attn_res = text["attn_res_block_size"] is not None
    root = "language_model.model."
    spec: dict[str, tuple[tuple[int, ...], str]] = {
        f"{root}embed_tokens.weight": ((v, h), "embed"),
        f"{root}norm.weight": ((h,), "norm"),
        "language_model.lm_head.weight": ((v, h), "linear"),
    }
    if attn_res:
        spec[f"{root}output_attn_res_norm.weight"] = ((h,), "norm")
        spec[f"{root}output_attn_res_proj.weight"] = ((1, h), "linear")
    for i in range(text["num_hidden_layers"]):
        p = f"{root}layers.{i}."
        spec[f"{p}input_layernorm.weight"] = ((h,), "norm")
        spec[f"{p}post_attention_layernorm.weight"] = ((h,), "norm")
        if attn_res:
            for name in ("self_attention_res", "mlp_res"):
                spec[f"{p}{name}_norm.weight"] = ((h,), "norm")
                spec[f"{p}{name}_proj.weight"] = ((1, h), "linear")
        a = f"{p}self_attn."
        if i + 1 in kda["kda_layers"]:  # KimiK3DeltaAttention
            for name in ("q_proj", "k_proj", "v_proj", "g_proj"):
                spec[f"{a}{name}.weight"] = ((proj, h), "linear")
            spec[f"{a}f_a_proj.weight"] = ((kd, h), "linear")
            spec[f"{a}b_proj.weight"] = ((kh, h), "linear")
            spec[f"{a}f_b_proj.weight"] = ((proj, kd), "linear")
            for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
                spec[f"{a}{name}.weight"] = ((proj, 1, kc), "f32")
            spec[f"{a}dt_bias"] = ((proj,), "bias")
            spec[f"{a}A_log"] = ((kh,), "a_log")
            spec[f"{a}o_norm.weight"] = ((kd,), "norm")
            spec[f"{a}o_proj.weight"] = ((h, proj), "linear")
        else:  # MultiHeadLatentAttention (q-LoRA, output gate)
            spec[f"{a}q_a_proj.weight"] = ((ql, h), "linear")
            spec[f"{a}kv_a_proj_with_mqa.weight"] = ((kvl + rope, h), "linear")
            spec[f"{a}g_proj.weight"] = ((nh * vd, h), "linear")
            spec[f"{a}q_a_layernorm.weight"] = ((ql,), "norm")
            spec[f"{a}q_b_proj.weight"] = ((nh * (nope + rope), ql), "linear")
            spec[f"{a}kv_a_layernorm.weight"] = ((kvl,), "norm")
            spec[f"{a}kv_b_proj.weight"] = ((nh * (nope + vd), kvl), "linear")
            spec[f"{a}o_proj.weight"] = ((h, nh * vd), "linear")
        if i < text["first_k_dense_replace"]:
            m, width = f"{p}mlp.", text["intermediate_size"]
            spec[f"{m}gate_proj.weight"] = ((width, h), "linear")
            spec[f"{m}up_proj.weight"] = ((width, h), "linear")
            spec[f"{m}down_proj.weight"] = ((h, width), "linear")
            continue
        m = f"{p}block_sparse_moe."
        spec[f"{m}gate.weight"] = ((experts, h), "linear")
        spec[f"{m}gate.e_score_correction_bias"] = ((experts,), "bias")
        spec[f"{m}shared_experts.gate_proj.weight"] = ((inter * shared, h), "linear")
        spec[f"{m}shared_experts.up_proj.weight"] = ((inter * shared, h), "linear")
        spec[f"{m}shared_experts.down_proj.weight"] = ((h, inter * shared), "linear")
        spec[f"{m}routed_expert_down_proj.weight"] = ((latent, h), "linear")
        spec[f"{m}routed_expert_norm.weight"] = ((latent,), "norm")
        spec[f"{m}routed_expert_up_proj.weight"] = ((h, latent), "linear")
        for e in range(experts):
            spec[f"{m}experts.{e}.w1.weight"] = ((inter, latent), "linear")
            spec[f"{m}experts.{e}.w3.weight"] = ((inter, latent), "linear")
            spec[f"{m}experts.{e}.w2.weight"] = ((latent, inter), "linear")
    return spec


def write_tiny_kimi_k3(path: Path, *, num_layers: int = 6, hidden: int = 256,
                       attn_res_block_size: int | None = 2, dtype: str = "bfloat16",
                       seed: int = 0) -> Path:
    """Build (or reuse) a random-weight ``KimiK3ForConditionalGeneration`` for vLLM >= 0.34.

    config.json is Kimi-K3's layout as vLLM 0.34.0 reads it (``model_type: kimi_k3``, vLLM's
    own ``KimiK3Config`` with a ``KimiLinearConfig`` text model, no remote code): a KDA + MLA
    hybrid (KDA at layers 1, 2, 4, 5 with Kimi-K3's full-rank gate, MLA at 3 and 6, 1-based),
    attention residuals over blocks of ``attn_res_block_size`` layers, a dense first layer and
    latent MoE after it, SiTU activations; hidden ``hidden``, vocabulary ``VOCAB_SIZE`` with
    Kimi's media tokens as the last ids (as :func:`build_kimi_k25`). A one-block vision config
    and an image-processor config are written for vLLM's processor, but no vision weights: serve
    it with ``--limit-mm-per-prompt '{"image": 0}'`` (the tower is then not built).
    """
    params: dict[str, Any] = {"arch": "kimi_k3", "builder_version": BUILDER_VERSION,
                              "num_layers": num_layers, "hidden": hidden,
                              "attn_res_block_size": attn_res_block_size, "dtype": dtype,
                              "seed": seed}
    path = Path(path)
    if _is_complete(path, params):
        return path
    text = kimi_k3_text_config(num_layers=num_layers, hidden=hidden,
                               attn_res_block_size=attn_res_block_size)
    text["dtype"] = dtype
    vision = {
        "model_type": "kimi_k3_vision", "patch_size": 14, "init_pos_emb_height": 4,
        "init_pos_emb_width": 4, "init_pos_emb_time": 4, "vt_num_attention_heads": 2,
        "vt_num_hidden_layers": 1, "vt_hidden_size": 64, "vt_intermediate_size": 128,
        "qkv_hidden_size": 192, "merge_kernel_size": [2, 2], "mm_hidden_size": 64,
        "text_hidden_size": hidden,
    }
    config = {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "text_config": text, "vision_config": vision,
        "media_placeholder_token_id": KIMI_MEDIA_PAD_ID, "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "tie_word_embeddings": False,
        "dtype": dtype,
    }
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tensors = _random_checkpoint(_kimi_k3_tensor_spec(text), seed, dtype)
    _write_checkpoint(tmp, config, tensors, extra_special=KIMI_MEDIA_TOKENS)
    # vLLM's KimiK3ProcessingInfo loads KimiK25FusedVisionProcessor from this folder.
    processor = {"media_proc_cfg": {
        "patch_size": 14, "merge_kernel_size": 2, "temporal_merge_kernel_size": 4,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 16,
        "patch_limit_on_one_side": 4, "in_patch_limit_each_frame": 16,
        "in_patch_limit_video": 16, "fixed_output_tokens": None}}
    (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return _publish(tmp, path, params)


#: DeepSeek-V4's attention schedule, scaled down: one of each block type (sliding window,
#: compressed sparse with the Lightning Indexer, heavily compressed).
DEEPSEEK_V4_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention",
                           "heavily_compressed_attention", "compressed_sparse_attention")
_DEEPSEEK_V4_COMPRESS = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def deepseek_v4_config(*, layer_types: tuple[str, ...] = DEEPSEEK_V4_LAYER_TYPES,
                       num_hash_layers: int = 1, hidden: int = 256) -> dict[str, Any]:
    """config.json of :func:`write_tiny_deepseek_v4`: transformers' ``DeepseekV4Config``
    fields (transformers >= 5.22 has the class; vLLM 0.34.0 uses it), no
    ``quantization_config``, so vLLM loads bfloat16 weights unquantized."""
    n = len(layer_types)
    head_dim, rope = 512, 64  # FlashMLA's DeepSeek-V4 kernels: 448 NoPE + 64 RoPE dims
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": VOCAB_SIZE, "hidden_size": hidden, "moe_intermediate_size": hidden // 2,
        "num_hidden_layers": n, "num_attention_heads": 16, "num_key_value_heads": 1,
        "head_dim": head_dim, "partial_rotary_factor": rope / head_dim, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128,
        "num_experts_per_tok": 2, "n_routed_experts": 8, "n_shared_experts": 1,
        "scoring_func": "sqrtsoftplus", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "topk_method": "noaux_tc", "swiglu_limit": 10.0, "hidden_act": "silu",
        "layer_types": list(layer_types), "compress_rates": dict(_DEEPSEEK_V4_COMPRESS),
        "mlp_layer_types": ["hash_moe"] * num_hash_layers + ["moe"] * (n - num_hash_layers),
        "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID, "dtype": "bfloat16",
    }


def _deepseek_v4_tensor_spec(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor vLLM 0.34.0's ``DeepseekV4ForCausalLM`` loads, under the names of
    DeepSeek's own checkpoints, which its ``hf_to_vllm_mapper`` maps (``embed.``,
    ``layers.{i}.attn.wq_a``, ``ffn.experts.{e}.w1``, ``ffn.gate.bias``, ``head.``)."""
    h, v, hd = config["hidden_size"], config["vocab_size"], config["head_dim"]
    nh, ql = config["num_attention_heads"], config["q_lora_rank"]
    groups, olr = config["o_groups"], config["o_lora_rank"]
    hc = config["hc_mult"]
    mix, hc_dim = (2 + hc) * hc, hc * h
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    inter, shared = config["moe_intermediate_size"], config["n_shared_experts"]
    ih, ihd = config["index_n_heads"], config["index_head_dim"]
    spec: dict[str, tuple[tuple[int, ...], str]] = {
        "embed.weight": ((v, h), "embed"),
        "norm.weight": ((h,), "norm"),
        "head.weight": ((v, h), "linear"),
        "hc_head_fn": ((hc, hc_dim), "f32"),
        "hc_head_base": ((hc,), "bias"),
        "hc_head_scale": ((1,), "f32norm"),
    }
    hash_layers = config["mlp_layer_types"].count("hash_moe")
    for i, layer_type in enumerate(config["layer_types"]):
        p = f"layers.{i}."
        spec[f"{p}attn_norm.weight"] = ((h,), "norm")
        spec[f"{p}ffn_norm.weight"] = ((h,), "norm")
        for part in ("attn", "ffn"):
            spec[f"{p}hc_{part}_fn"] = ((mix, hc_dim), "f32")
            spec[f"{p}hc_{part}_base"] = ((mix,), "bias")
            spec[f"{p}hc_{part}_scale"] = ((3,), "f32norm")
        a = f"{p}attn."
        spec[f"{a}wq_a.weight"] = ((ql, h), "linear")
        spec[f"{a}wkv.weight"] = ((hd, h), "linear")
        spec[f"{a}q_norm.weight"] = ((ql,), "norm")
        spec[f"{a}kv_norm.weight"] = ((hd,), "norm")
        spec[f"{a}wq_b.weight"] = ((nh * hd, ql), "linear")
        spec[f"{a}wo_a.weight"] = ((groups * olr, nh * hd // groups), "linear")
        spec[f"{a}wo_b.weight"] = ((h, groups * olr), "linear")
        spec[f"{a}attn_sink"] = ((nh,), "sink")
        ratio = config["compress_rates"].get(layer_type, 0)
        if ratio > 1:
            coff = 2 if ratio == 4 else 1  # the CSA compressor overlaps its windows
            spec[f"{a}compressor.ape"] = ((ratio, coff * hd), "f32")
            spec[f"{a}compressor.wkv.weight"] = ((coff * hd, h), "linear")
            spec[f"{a}compressor.wgate.weight"] = ((coff * hd, h), "linear")
            spec[f"{a}compressor.norm.weight"] = ((hd,), "norm")
        if ratio == 4:  # the Lightning Indexer, with a compressor of its own
            x = f"{a}indexer."
            spec[f"{x}wq_b.weight"] = ((ih * ihd, ql), "linear")
            spec[f"{x}weights_proj.weight"] = ((ih, h), "linear")
            spec[f"{x}compressor.ape"] = ((ratio, 2 * ihd), "f32")
            spec[f"{x}compressor.wkv.weight"] = ((2 * ihd, h), "linear")
            spec[f"{x}compressor.wgate.weight"] = ((2 * ihd, h), "linear")
            spec[f"{x}compressor.norm.weight"] = ((ihd,), "norm")
        f = f"{p}ffn."
        spec[f"{f}gate.weight"] = ((experts, h), "linear")
        if i < hash_layers:
            spec[f"{f}gate.tid2eid"] = ((v, top_k), f"hash:{experts}")
        else:
            spec[f"{f}gate.bias"] = ((experts,), "bias")
        for e in range(experts):
            spec[f"{f}experts.{e}.w1.weight"] = ((inter, h), "linear")
            spec[f"{f}experts.{e}.w3.weight"] = ((inter, h), "linear")
            spec[f"{f}experts.{e}.w2.weight"] = ((h, inter), "linear")
        spec[f"{f}shared_experts.w1.weight"] = ((inter * shared, h), "linear")
        spec[f"{f}shared_experts.w3.weight"] = ((inter * shared, h), "linear")
        spec[f"{f}shared_experts.w2.weight"] = ((h, inter * shared), "linear")
    return spec


def write_tiny_deepseek_v4(path: Path, *,
                           layer_types: tuple[str, ...] = DEEPSEEK_V4_LAYER_TYPES,
                           num_hash_layers: int = 1, hidden: int = 256,
                           dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Build (or reuse) a random-weight ``DeepseekV4ForCausalLM`` for vLLM >= 0.34 (bfloat16,
    no ``quantization_config``: vLLM's DeepSeek-V4 FP8/FP4 path is not taken).

    The real model's structure, scaled down: mHC residual streams (``hc_mult`` 4), MQA with a
    512-wide head (448 NoPE + 64 RoPE, what FlashMLA's DeepSeek-V4 kernels take), q-LoRA, the
    grouped output projection, attention sinks, and one layer per ``layer_types`` entry
    (default: sliding window, compressed sparse with the Lightning Indexer, heavily compressed,
    compressed sparse again); MoE everywhere with ``num_hash_layers`` hash-routed layers first,
    one shared expert, sqrt-softplus routing. ``layer_types`` of only ``"sliding_attention"``
    leaves out the compressors and the indexer (and the kernels they need).
    """
    params: dict[str, Any] = {"arch": "deepseek_v4", "builder_version": BUILDER_VERSION,
                              "layer_types": list(layer_types),
                              "num_hash_layers": num_hash_layers, "hidden": hidden,
                              "dtype": dtype, "seed": seed}
    path = Path(path)
    if _is_complete(path, params):
        return path
    config = deepseek_v4_config(layer_types=layer_types, num_hash_layers=num_hash_layers,
                                hidden=hidden)
    config["dtype"] = dtype
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tensors = _random_checkpoint(_deepseek_v4_tensor_spec(config), seed, dtype)
    _write_checkpoint(tmp, config, tensors)
    return _publish(tmp, path, params)
