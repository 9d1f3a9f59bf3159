"""``python -m speccompat doctor | matrix | adapters | verify``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from . import matrix, registry, verify
from .cuda_wheels import shadowed_cuda_bindings, stale_cuda_wheels
from .imports import import_failures
from .outcomes import Outcome, State
from .record import Adapter, ExtractionPath
from .registry import WILL_APPLY_IN_SERVE
from .versions import Environment, detect, distribution_version

# 128 + SIGPIPE, what a shell reports for a command whose reader went away (`... | head`).
EXIT_CLOSED_PIPE = 141
EXIT_CODES = f"""\
exit codes:
  doctor    0 the installed pair is supported and every selected adapter applied; 1 otherwise
  matrix    0
  adapters  0
  verify    0 every file passes; 1 any failure (a bad file, a gap, no file); 2 without torch
  any       2 on a usage error; {EXIT_CLOSED_PIPE} when the output pipe closed early (`| head`)
"""


def doctor(as_json: bool, show_all: bool = False) -> int:
    """Apply in this process and print what happened; 0 only when all is well."""
    env = detect(device=True)
    # Read from metadata before anything imports vLLM, which these wheels can break.
    installed = list(metadata.distributions())
    stale = stale_cuda_wheels(installed)
    shadowed = shadowed_cuda_bindings(installed)
    # Where apply() refuses the in-process path (no V1 runner), it is not judged again: its
    # adapters come back unsupported, and the refusal is the verdict for that path.
    refusal = registry.in_process_refusal(env)
    # The usual check imports speculators after apply(), which refuses here: import it as is.
    failures = import_failures(tuple(name for name, package in (
        ("vllm", env.vllm), ("speculators", env.speculators)) if package is not None),
        plain=("speculators",) if refusal is not None else ())
    in_process = list(registry.catalogues()[ExtractionPath.IN_PROCESS])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = registry._apply(environment=env, adapters=in_process,
                                 judge_support=refusal is None)
        server_path = registry.server_verdict(env)
    support = report.support
    server_user = (env.speculators is not None
                   and matrix.path_of(env.speculators.version) == matrix.SERVER)
    if refusal is None:
        ok = report.ok
    elif server_user:  # speculators >= 0.5 does not use apply(): the pair's verdict stands
        ok = support.supported
    else:
        support = matrix.Support(False, refusal.found, refusal.supported, refusal.advice)
        ok = False
    ok = ok and not any(o.state in (State.FAILED, State.UNSUPPORTED) for o in server_path)
    ok = ok and not (stale is not None and stale.torchcodec) and shadowed is None
    ok = ok and not failures
    if as_json:
        payload = report.as_dict()
        payload["ok"] = ok
        payload["supported"] = support.supported
        payload["support"] = support.message
        payload["in_process_refused"] = str(refusal) if refusal is not None else None
        payload["stale_cuda_wheels"] = stale.message if stale is not None else None
        payload["shadowed_cuda_bindings"] = shadowed.message if shadowed is not None else None
        payload["import_failures"] = [f.as_dict() for f in failures]
        payload["server_path"] = [o.as_dict() for o in server_path]
        payload["warnings"] = [str(w.message) for w in caught]
        payload["summary"] = summary(env)
        print(json.dumps(payload, indent=2))
        return 0 if ok else 1
    print(env.describe())
    print(support.message)
    print("in-process path (speculators 0.3/0.4's generator after speccompat.apply()):")
    if refusal is not None:
        print(f"  refused: apply() raises {type(refusal).__name__}: {refusal}")
    if refusal is None or show_all:
        _print_outcomes(report.outcomes, show_all, env.vllm is None)
    print("server path (vllm serve with extract_hidden_states; applied by the plugin):")
    _print_outcomes(server_path, show_all, env.vllm is None)
    for w in caught:
        print(f"warning: {w.message}")
    for failure in failures:
        print(f"environment: {failure.message}")
    if stale is not None:
        print(f"environment: {stale.message}")
    if shadowed is not None:
        print(f"environment: {shadowed.message}")
    print("OK" if ok else "NOT OK: see the lines above")
    print("\nFor a bug report:")
    print("\n".join(f"  {key}: {value}" for key, value in summary(env).items()))
    return 0 if ok else 1


# Short by default: what applies, what will apply in vllm serve, and what went wrong.
_SHOWN = (State.APPLIED, State.FAILED, State.UNSUPPORTED)


def _label(outcome: Outcome) -> str:
    if outcome.state is State.SKIPPED and outcome.reason.endswith(WILL_APPLY_IN_SERVE):
        return "applies in vllm serve"
    return outcome.state.value


def _print_outcomes(outcomes: Sequence[Outcome], show_all: bool, no_vllm: bool) -> None:
    if no_vllm and not show_all:
        print("  none can be selected: vLLM is not installed")
        return
    shown = [o for o in outcomes
             if show_all or o.state in _SHOWN or _label(o) != o.state.value]
    width = max((len(o.adapter) for o in shown), default=0)
    labels = max((len(_label(o)) for o in shown), default=0)
    for o in shown:
        print(f"  {o.adapter:<{width}}  {_label(o):<{labels}}  "
              f"{o.reason.removesuffix(WILL_APPLY_IN_SERVE)}")
    hidden = len(outcomes) - len(shown)
    more = f"{hidden} not needed or skipped here: doctor --all lists them"
    if hidden and shown:
        print(f"  ({more.replace(' not', ' more not', 1)})")
    elif hidden:
        print(f"  none applies ({more})")
    elif not shown:
        print("  none")


def summary(env: Environment) -> dict[str, str]:
    """The environment in the shape of vLLM's collect-env, to paste into a bug report."""
    def version(distribution: str) -> str:
        return distribution_version(distribution) or "not installed"

    vllm = (f"{env.vllm.raw} ({env.vllm.distribution})" if env.vllm is not None
            else "not installed")
    device = env.platform or "unknown"
    if env.compute_capability:
        device += f" (compute capability {env.compute_capability[0]}.{env.compute_capability[1]})"
    return {
        "speccompat": version("speccompat"),
        "python": f"{env.python} ({platform.system()} {platform.machine()})",
        "vllm": vllm,
        "speculators": version("speculators"),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "triton": version("triton"),
        "device": device,
        "SPECCOMPAT_DISABLE": os.environ.get("SPECCOMPAT_DISABLE", "unset"),
        "SPECCOMPAT_SKIP": os.environ.get("SPECCOMPAT_SKIP", "unset"),
    }


def show_matrix(as_json: bool, vllm: str | None = None, speculators: str | None = None) -> int:
    outcomes = matrix.recorded_outcomes()
    rows = []
    for c in matrix.CELLS:
        if vllm not in (None, c.vllm) or speculators not in (None, c.speculators):
            continue
        recorded = outcomes.get(matrix.outcome_key(c), {})
        rows.append({"vllm": c.vllm, "speculators": c.speculators, "path": c.path,
                     "transformers": c.transformers or "resolved",
                     "outcome": recorded.get("outcome", "not run"),
                     "recorded": recorded.get("date", ""), "ci": bool(recorded.get("ci")),
                     "install": c.wheel, "note": recorded.get("note", "")})
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'vLLM':<10} {'speculators':<12} {'path':<11} {'transformers':<13} "
          f"{'outcome':<14} {'CI':<4} note")
    for r in rows:
        print(f"{r['vllm']:<10} {r['speculators']:<12} {r['path']:<11} {r['transformers']:<13} "
              f"{r['outcome']:<14} {'yes' if r['ci'] else '':<4} {r['note']}")
    return 0


def show_adapters(markdown: bool, as_json: bool) -> int:
    """The adapter catalogue, generated from the records themselves."""
    adapters = registry.catalogue()
    if as_json:
        print(json.dumps([_as_dict(a) for a in adapters], indent=2))
    elif markdown:
        print(adapters_markdown(adapters), end="")
    else:
        for a in adapters:
            if a.cause == "speculators":  # its own code: the selector says it all
                spec = "any vLLM"
            else:
                spec = ("any speculators" if a.speculators is None
                        else f"speculators {a.speculators}")
            print(f"{a.id}\n    {a.summary}\n    selected by {a.cause} {a.cause_specifier}; "
                  f"{spec}; {a.side.value} side{_platform_clause(a)}")
            print(f"    why: {a.why}\n    how: {a.how}")
            print(f"    upstream: {a.upstream}\n    upstream reference: {a.upstream_ref}")
            print(f"    remove when: {a.remove_when}")
    return 0


def _platform_clause(adapter: Adapter) -> str:
    """After the side, where a record is bound to one vLLM platform."""
    return "" if adapter.platform is None else f"; only on the {adapter.platform} platform"


def _as_dict(adapter: Adapter) -> dict[str, str | None]:
    """The record's fields, and its path (its wing) before ``remove_when`` as they were."""
    fields = adapter.as_dict()
    remove_when = fields.pop("remove_when")
    return {**fields, "path": registry.wing_of(adapter).value, "remove_when": remove_when}


PATH_TITLES = {
    ExtractionPath.SERVER: ("Server path", "speculators >= 0.5 through `vllm serve` with "
                            "`extract_hidden_states`: speccompat's vLLM plugin applies these in "
                            "the server's processes."),
    ExtractionPath.IN_PROCESS: ("In-process generator", "speculators 0.3/0.4's "
                                "`VllmHiddenStatesGenerator`: `speccompat.apply()` applies "
                                "these."),
}


def _sentence(text: str) -> str:
    """As written (a record may start with "vLLM" or an identifier), ending in a period."""
    text = text.strip()
    return text if text.endswith(".") else f"{text}."


def adapters_markdown(adapters: Sequence[Adapter]) -> str:
    """The catalogue, one section per adapter as vllm-ascend's patch catalogue reads: what it
    normalizes, then its module's docstring as the body (why and how, in full), the upstream
    change and reference, what selects it and when it can go: docs/adapters.md. The record's
    one-line why and how (what ``report()`` prints) stand in for the body only where the
    module's docstring was already given under another adapter, so nothing is said twice."""
    import importlib

    lines = ["# Adapters", "",
             "Generated from the adapter records (`python -m speccompat adapters "
             "--markdown`). An adapter is selected by the package whose release caused the "
             "break and confirmed by a probe of the installed code; `SPECCOMPAT_SKIP=<id>` "
             "skips one.", ""]
    described: dict[str, str] = {}
    for path, (title, intro) in PATH_TITLES.items():
        lines += [f"## {title}", "", intro, ""]
        for a in (a for a in adapters if registry.wing_of(a) is path):
            spec = ("" if a.cause == "speculators" or a.speculators is None
                    else f", speculators `{a.speculators}`")
            lines += [f"### `{a.id}`", "", f"**What:** {_sentence(a.summary)}", ""]
            module = a.probe.__module__
            doc = (importlib.import_module(module).__doc__ or "").strip()
            if doc and module not in described:
                described[module] = a.id
                lines += [doc, ""]
            else:
                lines += [f"- **Why:** {_sentence(a.why)}", f"- **How:** {_sentence(a.how)}"]
                if module in described:
                    lines.append(f"- **Details:** under `{described[module]}`.")
            lines += [f"- **Upstream:** {a.upstream}; {_sentence(a.upstream_ref)}",
                      f"- **Selected by:** {a.cause} `{a.cause_specifier}`{spec}; "
                      f"{a.side.value} side{_platform_clause(a)}.",
                      f"- **Remove when:** {_sentence(a.remove_when)}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def verify_outputs(directory: Path, model: Path | None, as_json: bool,
                   layer_ids: Sequence[int] | None = None) -> int:
    """Check hidden-state files in ``directory``; 0 only when every file passes."""
    try:
        report = verify.verify_dir(directory, model=model, layer_ids=layer_ids)
    except verify.TorchMissingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report.to_json() if as_json else report.render())
    return 0 if report.ok else 1


def parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    root = argparse.ArgumentParser(prog="speccompat", description=__doc__, epilog=EXIT_CODES,
                                   formatter_class=formatter)
    root.add_argument("--version", action="store_true", help="print the version and exit")
    root.add_argument("--json", action="store_true", help="with --version: machine-readable")
    sub = root.add_subparsers(dest="command")
    p_doctor = sub.add_parser(
        "doctor", help="environment, support verdict, every adapter's state",
        description="Apply the adapters in this process and report every adapter's state. "
        "Exit 0 only if the installed pair is supported and every selected adapter applied; "
        "1 otherwise.")
    p_doctor.add_argument("--json", action="store_true", help="machine-readable output")
    p_doctor.add_argument("--all", action="store_true", dest="show_all",
                          help="every adapter, also those not needed or skipped here")
    p_matrix = sub.add_parser("matrix", help="the supported (vLLM, speculators) cells",
                              description="The supported matrix, each cell with the outcome "
                              "of its recorded run. Exit 0.")
    p_matrix.add_argument("--json", action="store_true", help="machine-readable output")
    p_matrix.add_argument("--vllm", metavar="X.Y.Z", help="only the cells of this vLLM release")
    p_matrix.add_argument("--speculators", metavar="X.Y.Z",
                          help="only the cells of this speculators release")
    p_adapters = sub.add_parser("adapters", help="the adapter catalogue",
                                description="Every adapter record. Exit 0.")
    form = p_adapters.add_mutually_exclusive_group()
    form.add_argument("--markdown", action="store_true",
                      help="one Markdown page, a section per adapter (docs/adapters.md)")
    form.add_argument("--json", action="store_true", help="machine-readable output")
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
    p_verify.add_argument("--layer-ids", metavar="ID", type=int, nargs="+", default=None,
                          help="the eagle_aux_hidden_state_layer_ids the server was asked for "
                          "(speculators >= 0.5 records none); with --model, id 0 is compared "
                          "with the model's embeddings")
    p_verify.add_argument("--json", action="store_true", help="machine-readable output")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    root = parser()
    args = root.parse_args(argv)
    if args.version:
        version = metadata.version("speccompat")
        print(json.dumps({"speccompat": version}) if args.json else f"speccompat {version}")
        return 0
    if args.command is None:
        root.error("a command is required: doctor, matrix, adapters or verify")
    try:
        code = _run(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
    except BrokenPipeError:
        # The reader went away (`python -m speccompat matrix | head -1`): stop quietly, and
        # point stdout at /dev/null so the interpreter's own flush at exit does not fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    return code


def _run(args: argparse.Namespace) -> int:
    if args.command == "verify":
        return verify_outputs(args.directory, args.model, args.json, args.layer_ids)
    if args.command == "doctor":
        return doctor(args.json, args.show_all)
    if args.command == "matrix":
        return show_matrix(args.json, args.vllm, args.speculators)
    return show_adapters(args.markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
