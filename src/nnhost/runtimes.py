"""Runtimes: an environment per nnsight version, so that each client is served by its own version's code.

Why it exists: a job runs with the nnsight code of the process that runs it,
and the server's own environment pins one nnsight. A client of another
version is served by a *runtime*: a small environment holding only that
nnsight (and what it needs beyond the server's own packages), layered over
the server's environment by a ``.pth`` file, so that it costs seconds to
build and no second torch. A replica starts a template process with the
runtime's interpreter (`replicas.runtimes`); it maps the host's weights, so a
runtime costs a process, never a second copy of the model.

Runtimes live inside the environment nnhost is installed in
(``<prefix>/nnhost-runtimes/nnsight-X``), so that they are made and removed
with it. ``nnhost runtimes`` (and ``make install``) builds them, from the
package index; a runtime is *installed* once its marker file exists, written
last, after its nnsight was imported and checked.

This module knows paths and versions only: it never starts a server process,
and never decides which versions a server serves (`client_versions` and the
``client_versions`` setting do).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional, Sequence

#: The nnsight versions nnhost can serve beside the server's own, each in its runtime.
#: (0.5 is not among them: its requests ship functions as bytecode, which the
#: restricted unpickler refuses by design.)
RUNTIME_VERSIONS = ("0.8.0", "0.7.0", "0.6.3")
#: What a runtime installs beside its nnsight: nnterp (in the default allowlist)
#: imports with the nnsight layout of 0.6 and 0.7 only (`nnsight.intervention.tracing`).
RUNTIME_EXTRAS = {"0.7.0": ("nnterp==1.3.0",), "0.6.3": ("nnterp==1.3.0",)}
MARKER = ".installed"


def home() -> Path:
    """Where this installation's runtimes live: inside the environment nnhost is installed in."""
    return Path(sys.prefix) / "nnhost-runtimes"


def root(version: str) -> Path:
    return home() / f"nnsight-{version}"


def interpreter(version: str) -> Path:
    """The Python of ``version``'s runtime (it runs that runtime's templates and job processes)."""
    return root(version) / "bin" / "python"


def site_packages(version: str) -> Path:
    """Where ``version``'s runtime keeps its own packages (it runs this very Python)."""
    return Path(sysconfig.get_path("purelib", vars={"base": str(root(version)), "platbase": str(root(version))}))


def installed() -> tuple[str, ...]:
    """The runtime versions built and checked here."""
    return tuple(version for version in RUNTIME_VERSIONS if _marked(version))


def requirements(version: str) -> tuple[str, ...]:
    """What ``version``'s runtime installs: that nnsight, and its extras."""
    return (f"nnsight=={version}", *RUNTIME_EXTRAS.get(version, ()))


def _marked(version: str) -> bool:
    # The marker names what was installed: a runtime built before its
    # requirements changed is built again by the next `nnhost runtimes`.
    try:
        return (root(version) / MARKER).read_text().split() == list(requirements(version))
    except OSError:
        return False


def build(version: str, *, quiet: bool = True) -> Path:
    """Build ``version``'s runtime (again, if it exists): a venv over this one, and that nnsight.

    The ``.pth`` names this environment's packages and nnhost's own source
    (an editable install's path is not a package directory), after the
    runtime's own: its nnsight comes first, everything else is shared.
    Raises `RuntimeError` saying what failed.
    """
    if version not in RUNTIME_VERSIONS:
        raise RuntimeError(f"nnhost has no runtime for nnsight {version}; it has {', '.join(RUNTIME_VERSIONS)}")
    target = root(version)
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = interpreter(version)
    import nnhost

    shared = [sysconfig.get_paths()["purelib"], str(Path(nnhost.__file__).resolve().parent.parent)]
    (site_packages(version) / "nnhost-runtime.pth").write_text("".join(f"{path}\n" for path in dict.fromkeys(shared)))
    wanted = requirements(version)
    extras = wanted[1:]
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", *wanted]
    if quiet:
        command.append("--quiet")
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {' '.join(wanted)} into {target}:\n{done.stderr[-3000:]}")
    check = subprocess.run(
        [str(python), "-c", "import nnsight, nnhost.execution.host.template; print(nnsight.__version__)"
         + "".join(f"; import {extra.split('==')[0]}" for extra in extras)],
        capture_output=True, text=True,
    )
    if check.returncode != 0 or check.stdout.strip() != version:
        raise RuntimeError(f"the runtime in {target} does not import nnsight {version}:\n"
                           f"{(check.stderr or check.stdout)[-3000:]}")
    (target / MARKER).write_text(" ".join(requirements(version)) + "\n")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nnhost runtimes", description="Build the environments in which other nnsight versions' clients run.")
    parser.add_argument("versions", nargs="*", metavar="VERSION",
                        help=f"nnsight versions (default: those not built yet of {', '.join(RUNTIME_VERSIONS)})")
    parser.add_argument("--again", action="store_true", help="rebuild runtimes that are already built")
    args = parser.parse_args(argv)
    wanted = args.versions or [v for v in RUNTIME_VERSIONS if args.again or v not in installed()]
    for version in wanted:
        try:
            print(f"nnhost runtimes: nnsight {version} -> {build(version)}", flush=True)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
            print(f"nnhost runtimes: {error}", file=sys.stderr)
            return 1
    if not wanted:
        print(f"nnhost runtimes: all built in {home()} ({', '.join(installed()) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
