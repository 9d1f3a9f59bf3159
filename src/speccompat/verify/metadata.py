"""What the directory and the model record: ``data_config.json``, ``sample_lengths.json``
and the model's ``config.json``, read defensively."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_CONFIG = "data_config.json"
SAMPLE_LENGTHS = "sample_lengths.json"


def hidden_size_from_config(config: Mapping[str, Any]) -> int | None:
    """``hidden_size`` or ``text_config.hidden_size`` of a Hugging Face config.json."""
    hidden = _positive_int(config.get("hidden_size"))
    text = config.get("text_config")
    if hidden is None and isinstance(text, Mapping):
        hidden = _positive_int(text.get("hidden_size"))
    return hidden


def model_config(model: Path) -> tuple[Path, Any]:
    """(the path of ``model``'s config.json, its parsed contents); ``model`` is a model
    directory or its config.json. Raises ``ValueError`` saying what is wrong."""
    config_path = model / "config.json" if model.is_dir() else model
    try:
        return config_path, json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--model {model}: no config.json at {config_path}") from None
    except (OSError, ValueError) as error:
        raise ValueError(f"--model {model}: cannot read {config_path}: {error}") from None


def model_hidden_size(model: Path) -> int:
    """The hidden size from ``model`` (a model directory or its config.json).

    Raises ``ValueError`` saying what is wrong when it cannot be determined.
    """
    config_path, config = model_config(model)
    hidden = hidden_size_from_config(config) if isinstance(config, Mapping) else None
    if hidden is None:
        raise ValueError(f"--model {model}: {config_path} has neither hidden_size nor "
                         "text_config.hidden_size")
    return hidden


@dataclass(frozen=True)
class Metadata:
    """What ``data_config.json`` (and ``sample_lengths.json``) record, read defensively."""

    layer_ids: tuple[int, ...] | None = None
    hidden_size: int | None = None
    model_path: str | None = None
    package_versions: Mapping[str, str] = field(default_factory=dict)
    num_samples: int | None = None
    file_pattern: str | None = None
    sample_lengths: Mapping[int, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _dig(data: Mapping[str, Any], *paths: tuple[str, ...]) -> Any:
    for path in paths:
        node: Any = data
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                break
            node = node[key]
        else:
            return node
    return None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_metadata(directory: Path) -> Metadata:
    """Read ``data_config.json`` and ``sample_lengths.json`` if present; never raises."""
    problems: list[str] = []
    notes: list[str] = []
    layer_ids: tuple[int, ...] | None = None
    hidden: int | None = None
    model_path: str | None = None
    versions: dict[str, str] = {}
    num_samples: int | None = None
    pattern: str | None = None
    lengths: dict[int, int] = {}

    config_path = directory / DATA_CONFIG
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            problems.append(f"{DATA_CONFIG} is unreadable: {error}")
            config = None
        if config is not None and not isinstance(config, Mapping):
            problems.append(f"{DATA_CONFIG} is not a JSON object")
            config = None
        if config is not None:
            ids = _dig(config, ("hidden_states", "layer_ids"), ("layer_ids",))
            if isinstance(ids, list) and all(is_int(i) for i in ids) and ids:
                layer_ids = tuple(ids)
            elif ids is not None:
                notes.append(f"{DATA_CONFIG}: layer_ids {ids!r} is not a list of integers; "
                             "ignored")
            hidden = _positive_int(_dig(config, ("model", "hidden_size"), ("hidden_size",)))
            value = _dig(config, ("model", "target_model_path"), ("target_model_path",),
                         ("model_path",))
            model_path = value if isinstance(value, str) else None
            value = _dig(config, ("reproducibility", "package_versions"), ("package_versions",))
            if isinstance(value, Mapping):
                versions = {str(k): str(v) for k, v in value.items()}
            value = _dig(config, ("speculators_version",))
            if isinstance(value, str):
                versions.setdefault("speculators", value)
            value = _dig(config, ("data", "num_samples"), ("num_samples",))
            num_samples = int(value) if is_int(value) else None
            value = _dig(config, ("format", "file_pattern"), ("file_pattern",))
            pattern = value if isinstance(value, str) else None
            recorded = [f"layer_ids {list(layer_ids)}" if layer_ids else None,
                        f"hidden_size {hidden}" if hidden else None,
                        f"model {model_path}" if model_path else None,
                        ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or None]
            notes.insert(0, f"{DATA_CONFIG}: " + (
                "; ".join(r for r in recorded if r) or "records nothing verify uses"))

    lengths_path = directory / SAMPLE_LENGTHS
    if lengths_path.is_file():
        try:
            raw = json.loads(lengths_path.read_text(encoding="utf-8"))
            if isinstance(raw, Mapping):
                lengths = {int(k): int(v) for k, v in raw.items()}
        except (OSError, ValueError, TypeError) as error:
            notes.append(f"{SAMPLE_LENGTHS} is unreadable ({error}); ignored")

    return Metadata(layer_ids=layer_ids, hidden_size=hidden, model_path=model_path,
                    package_versions=versions, num_samples=num_samples, file_pattern=pattern,
                    sample_lengths=lengths, problems=tuple(problems), notes=tuple(notes))
