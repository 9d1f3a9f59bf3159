"""Id 0 against the target model's own embeddings (``verify DIR --model M --layer-ids ...``).

Id 0 is the input of decoder layer 0: the embedding rows of the prompt's tokens, bit for bit,
on every stack that adds nothing to the rows it looks up. Corruptions of that one slot keep
the shape and the dtype and are finite, so nothing else in ``verify`` sees them: an eager
server's first layer adding into the captured tensor (Kimi-Linear, vLLM 0.27+: the layer's
update instead of the embeddings), or a slot order other than the one asked for. Where the
ids say which slot is id 0 and the checkpoint holds an ``embed_tokens`` tensor, each file's
id-0 slot is compared with the rows of its ``token_ids``, cast to the file's dtype as vLLM
casts the weights.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .metadata import model_config

# Text-model types whose stack captures the looked-up rows unscaled as id 0. Others may scale
# or mix them first (Gemma's normalizer, Granite's embedding_multiplier, MiniCPM's scale_emb).
PLAIN_EMBEDDINGS = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "deepseek_v2",
    "deepseek_v3", "kimi_k2", "kimi_linear", "kimi_k3",
})
# Placeholders that multimodal models replace with image/audio embeddings before layer 0.
_MEDIA_TOKEN_KEYS = ("image_token_id", "image_token_index", "video_token_id",
                     "audio_token_id", "media_placeholder_token_id")
EMBEDDINGS_SUFFIX = "embed_tokens.weight"


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _safe_open() -> Any:
    # Imported when a model is read, never at import time (as ``readers`` does).
    return importlib.import_module("safetensors").safe_open


def _weight_files(model: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it, from the index or the headers."""
    index = model / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: model / file for name, file in weight_map.items()}
    safe_open = _safe_open()
    found: dict[str, Path] = {}
    for path in sorted(model.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            found.update(dict.fromkeys(handle.keys(), path))
    return found


class Embeddings:
    """The checkpoint's embedding rows, read one token at a time and kept."""

    def __init__(self, path: Path, name: str, skip_tokens: frozenset[int]) -> None:
        self.path, self.name, self.skip_tokens = path, name, skip_tokens
        self._rows: dict[int, Any] = {}
        self._slice: Any = None
        self._handle: Any = None
        self._vocabulary = 0

    @classmethod
    def open(cls, model: Path) -> Embeddings | str:
        """The model's embeddings, or why id 0 cannot be compared with them. ``model``: the
        model folder, or its ``config.json`` (as ``--model`` takes either)."""
        try:
            config_file, config = model_config(model)
        except ValueError as error:
            return str(error)
        if not isinstance(config, Mapping):
            return f"{config_file} is not a JSON object"
        model = config_file.parent
        model_type = text_config(config).get("model_type")
        if model_type not in PLAIN_EMBEDDINGS:
            return (f"model_type {model_type!r} may scale or mix its embeddings before layer 0 "
                    f"(compared for: {', '.join(sorted(PLAIN_EMBEDDINGS))})")
        try:
            names = _weight_files(model)
        except Exception as error:  # an unreadable checkpoint is a note, not a crash
            return f"cannot list the tensors of {model}: {error}"
        candidates = sorted((n for n in names if n.endswith(EMBEDDINGS_SUFFIX)), key=len)
        if not candidates:
            return f"no *{EMBEDDINGS_SUFFIX} tensor in {model}'s safetensors files"
        skip = frozenset(int(v) for c in (config, text_config(config))
                         for k, v in c.items() if k in _MEDIA_TOKEN_KEYS and isinstance(v, int))
        return cls(names[candidates[0]], candidates[0], skip)

    def _row(self, token: int) -> Any:
        if token not in self._rows:
            if self._slice is None:
                self._handle = _safe_open()(str(self.path), framework="pt")
                self._slice = self._handle.get_slice(self.name)
                self._vocabulary = int(self._slice.get_shape()[0])
            if not 0 <= token < self._vocabulary:
                raise IndexError(f"token id {token} is outside {self.name}'s "
                                 f"{self._vocabulary} rows")
            self._rows[token] = self._slice[token:token + 1][0]
        return self._rows[token]

    def mismatch(self, torch: Any, token_ids: Any, state: Any) -> str | None:
        """Why ``state`` ([tokens, hidden], id 0's slot) is not the rows of ``token_ids``, or
        ``None`` where it is, bit for bit in the file's dtype."""
        tokens = [int(t) for t in token_ids.tolist()]
        keep = [i for i, t in enumerate(tokens) if t not in self.skip_tokens]
        if not keep:
            return None
        try:
            expected = torch.stack([self._row(tokens[i]) for i in keep]).to(state.dtype)
        except IndexError as error:
            return str(error)
        if expected.shape[-1] != state.shape[-1]:
            return (f"the model's {self.name} has rows of {expected.shape[-1]}, the file's "
                    f"states {state.shape[-1]}")
        got = state[keep]
        off = (got != expected).any(dim=1)
        count = int(off.sum().item())
        if not count:
            return None
        worst = float((got.float() - expected.float()).abs().max().item())
        return (f"id 0 is not the model's embeddings ({self.name}) for {count} of {len(keep)} "
                f"tokens (max |diff| {worst:.3g})")
