"""Where consumers look things up, read without importing them.

Adapters patch the consumer's own names (``from x import y`` leaves the consumer with
its own reference) and probe the upstream shape they expect from the source text: a file
read where an import would cost seconds and run the package's ``__init__``. What they
install in those names is in ``wrappers``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from functools import cache

# speculators 0.3.0 / 0.4.0: the in-process extraction system.
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER_EXTENSION = "speculators.data_generation.custom_worker"

# vLLM >= 0.17: the server path's hidden-states connector, and how its releases write a file.
HIDDEN_STATES_CONNECTOR = (
    "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector")
CONNECTOR_FORWARD_WRITE = "safetensors.torch.save_file(tensors, request.filename)"  # 0.17-0.21


@cache
def module_source(module: str) -> str | None:
    """The source text of ``module`` without importing it or its parent packages.

    Probes must be side-effect free, and importing a consumer package would run
    its ``__init__`` (speculators' imports vLLM and transformers).
    """
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        path = spec.origin
    else:
        roots = list(spec.submodule_search_locations or [])
        files = [os.path.join(root, *rest) + ".py" for root in roots]
        files += [os.path.join(root, *rest, "__init__.py") for root in roots]
        path = next((f for f in files if os.path.isfile(f)), None)
    if not path or not path.endswith(".py"):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def require_in_source(module: str, *needles: str) -> str | None:
    """Probe helper: ``None`` if every needle is in the source of ``module``, else what is not."""
    source = module_source(module)
    if source is None:
        return f"{module} is not installed"
    missing = [n for n in needles if n not in source]
    return f"{module} no longer contains {missing}" if missing else None


@dataclass(frozen=True)
class SourceDef:
    """A function or method as written in a module's source: its parameters (name ->
    whether it has a default) and its text. Read without importing the module, so a
    probe costs a file read where an import would cost seconds (vLLM's executor and
    scheduler modules pull in most of vLLM)."""

    params: dict[str, bool]
    text: str


def source_def(module: str, qualname: str) -> SourceDef | None:
    """``module``'s own definition of ``qualname`` (``"Class.method"`` or ``"function"``);
    ``None`` where it defines none (inherited, moved, removed). Overload stubs are
    skipped: the implementation is the last definition."""
    source = module_source(module)
    if source is None:
        return None
    *classes, name = qualname.split(".")
    start, end, indent = 0, len(source), ""
    for cls in classes:
        found = re.compile(rf"^{indent}class {cls}\b", re.M).search(source, start, end)
        if found is None:
            return None
        start = found.end()
        if source.startswith("(", start):  # bases, perhaps over several lines
            start = _closing_paren(source, start) + 1
        block_end = re.compile(rf"^{indent}\S", re.M).search(source, start)
        end = block_end.start() if block_end else len(source)
        indent += "    "
    defs = list(re.compile(rf"^{indent}(?:async )?def {name}\(", re.M).finditer(source, start, end))
    if not defs:
        return None
    head = defs[-1]
    close = _closing_paren(source, head.end() - 1)
    line_end = source.find("\n", close)
    body_end = re.compile(rf"^(?!{indent}\s)(?=\S|{indent}\S)", re.M).search(
        source, len(source) if line_end < 0 else line_end + 1, end)
    text = source[head.start():body_end.start() if body_end else end]
    return SourceDef(_params(source[head.end():close]), text)


def _closing_paren(text: str, at: int) -> int:
    depth = 0
    for index in range(at, len(text)):
        if text[index] in "([{":
            depth += 1
        elif text[index] in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return len(text)


def _params(signature: str) -> dict[str, bool]:
    signature = re.sub(r"#[^\n]*", "", signature)
    pieces, depth, current = [], 0, ""
    for char in signature:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            pieces.append(current)
            current = ""
        else:
            current += char
    pieces.append(current)
    out = {}
    for piece in (p.strip() for p in pieces):
        name = piece.split(":")[0].split("=")[0].strip().lstrip("*")
        if name and name != "/":
            out[name] = "=" in piece.split(":", 1)[-1] or "=" in piece.split(":")[0]
    return out
