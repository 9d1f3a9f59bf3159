#!/usr/bin/env python3
"""``../shared/gpu/stage.py`` with stand-ins for pins the package index lacks.

vLLM 0.34.0 pins ``flashinfer-python==0.7.3``, which the index these machines reach does not
have; the GPU tests do not use FlashInfer (``VLLM_USE_FLASHINFER_SAMPLER=0``). A stand-in (an
empty wheel of that name and version) lets the resolver finish; it is not shipped:

    python3 tools/gpu/stage_with_stand_ins.py --fake flashinfer-python==0.7.3 \\
        --vllm 0.34.0 --pkg speculators==0.9.0 --ship-torch --keep tilelang ... --out /tmp/parts

Every other argument is stage.py's. Staging for maintainers only: a user's
``pip install vllm==0.34.0`` installs the real FlashInfer.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from typing import Any

STAGE = Path(__file__).resolve().parents[3] / "shared" / "gpu" / "stage.py"


def stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """An empty wheel; names with '-' are written with '_', as pip expects of file names."""
    base = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{base}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{base}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{base}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: stand-in\n"
                       "Root-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{base}.dist-info/RECORD", "")
    return path


def main() -> int:
    argv, fakes = [], []
    args = iter(sys.argv[1:])
    for arg in args:
        if arg == "--fake":
            fakes.append(next(args).split("=="))
        else:
            argv.append(arg)
    spec = importlib.util.spec_from_file_location("stage", STAGE)
    assert spec and spec.loader, f"no stage.py at {STAGE}"
    stage: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    resolve = stage.resolve
    faked = {stage.norm(name) for name, _ in fakes}

    def resolve_with_stand_ins(vllm: str, pkgs: list[str], work: Path,
                               ship_torch: bool) -> list[dict[str, Any]]:
        wheels = [str(stand_in_wheel(work, name, version)) for name, version in fakes]
        items: list[dict[str, Any]] = resolve(vllm, [*pkgs, *wheels], work, ship_torch)
        return [i for i in items if stage.norm(i["metadata"]["name"]) not in faked]

    stage.resolve = resolve_with_stand_ins
    sys.argv = [str(STAGE), *argv]
    return int(stage.main())


if __name__ == "__main__":
    sys.exit(main())
