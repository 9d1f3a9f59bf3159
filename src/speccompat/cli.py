"""``python -m speccompat doctor | matrix | adapters | verify``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from . import matrix, registry, verify
from .versions import detect


def doctor(as_json: bool) -> int:
    """Apply in this process and print what happened; 0 only when all is well."""
    env = detect(device=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = registry.apply(environment=env)
    if as_json:
        payload = report.as_dict()
        payload["warnings"] = [str(w.message) for w in caught]
        print(json.dumps(payload, indent=2))
    else:
        print(report)
        for w in caught:
            print(f"warning: {w.message}")
        print("OK" if report.ok else "NOT OK: see the lines above")
    return 0 if report.ok else 1


def show_matrix(as_json: bool) -> int:
    cells = [{"vllm": c.vllm, "speculators": c.speculators,
              "transformers": c.transformers or "resolved", "ci": c.ci, "install": c.wheel,
              "note": c.note} for c in matrix.CELLS]
    if as_json:
        print(json.dumps(cells, indent=2))
        return 0
    print(f"{'vLLM':<10} {'speculators':<12} {'transformers':<13} {'CI':<4} note")
    for c in matrix.CELLS:
        transformers = c.transformers or "resolved"
        print(f"{c.vllm:<10} {c.speculators:<12} {transformers:<13} {'yes' if c.ci else '':<4} "
              f"{c.note}")
    return 0


def show_adapters(markdown: bool) -> int:
    """The adapter catalogue, generated from the records themselves."""
    adapters = registry.catalogue()
    if not markdown:
        for a in adapters:
            spec = ("any speculators" if a.speculators is None
                    else f"speculators {a.speculators}")
            print(f"{a.id}\n    {a.summary}\n    selected by {a.cause} {a.cause_specifier}; "
                  f"{spec}; {a.side.value} side")
            print(f"    upstream: {a.upstream}\n    remove when: {a.remove_when}")
        return 0
    print("| adapter | what it normalizes | upstream change | selected by | speculators | side |"
          " remove when |")
    print("|---|---|---|---|---|---|---|")
    for a in adapters:
        spec = str(a.speculators) if a.speculators is not None else "any"
        print(f"| `{a.id}` | {a.summary} | {a.upstream} | {a.cause} `{a.cause_specifier}` |"
              f" `{spec}` |"
              f" {a.side.value} | {a.remove_when} |")
    return 0


def verify_outputs(directory: Path, model: Path | None, as_json: bool) -> int:
    """Check hidden-state files in ``directory``; 0 only when every file passes."""
    try:
        report = verify.verify_dir(directory, model=model)
    except verify.TorchMissingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report.to_json() if as_json else report.render())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speccompat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_doctor = sub.add_parser("doctor", help="environment, support verdict, every adapter's state")
    p_doctor.add_argument("--json", action="store_true")
    p_matrix = sub.add_parser("matrix", help="the supported (vLLM, speculators) cells")
    p_matrix.add_argument("--json", action="store_true")
    p_adapters = sub.add_parser("adapters", help="the adapter catalogue")
    p_adapters.add_argument("--markdown", action="store_true")
    p_verify = sub.add_parser(
        "verify", help="check hidden-state extraction outputs in DIR",
        description="Check hidden-state extraction outputs: speculators 0.3/0.4 data_{i}.pt "
        "(read with torch.load(weights_only=True) only) or *.safetensors from speculators "
        ">= 0.5 / vLLM's ExampleHiddenStatesConnector. Exit 0 only if every file passes; "
        "1 on any failure; 2 without torch.")
    p_verify.add_argument("directory", metavar="DIR", type=Path,
                          help="where data_{i}.pt or *.safetensors files were written")
    p_verify.add_argument("--model", metavar="MODEL_DIR", type=Path, default=None,
                          help="the target model (its config.json gives the hidden size)")
    p_verify.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return verify_outputs(args.directory, args.model, args.json)
    if args.command == "doctor":
        return doctor(args.json)
    if args.command == "matrix":
        return show_matrix(args.json)
    return show_adapters(args.markdown)


if __name__ == "__main__":
    sys.exit(main())
