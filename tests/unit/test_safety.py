"""speccompat never opens vLLM's insecure serialization and never unpickles arbitrary code."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "speccompat"


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(SOURCE.rglob("*.py"))]


def test_no_insecure_serialization_switch() -> None:
    for path, text in _sources():
        assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in text, path


def test_no_unsafe_torch_load() -> None:
    for path, text in _sources():
        assert "weights_only=False" not in text, path
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}: {line.strip()}"
