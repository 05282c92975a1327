"""The command a stopped run prints to continue it: one that runs as printed from the
user's shell, launched the way this run was (make, the console script, a user's script,
``python -m``, torchrun), with the same overrides, the same run dir and resume=auto.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Set by the Makefile's `train` target to its directory: the run was started by
# `make train ARGS=...`, and is continued the same way.
MAKE_DIR_ENV = "OPTIMUS_MAKE_DIR"
CLI_MODULE = "optimus_preflight.cli"
_CLI_FILE = Path(__file__).resolve().parents[1] / "cli.py"
_REPLACED = ("hydra.run.dir=", "checkpoint.resume=")


@dataclass(frozen=True)
class Launch:
    """How this process was started: enough to say how to start it again."""

    argv0: str
    python: str
    environ: Mapping[str, str]
    cwd: str = "."

    @classmethod
    def current(cls) -> Launch:
        return cls(sys.argv[0] if sys.argv else "", sys.executable, os.environ, os.getcwd())


def _on_path(program: str, environ: Mapping[str, str], cwd: str = ".") -> str:
    """``program``'s bare name when the shell finds this very file under it, else its
    absolute path: `optimus-train` only works when .venv/bin is on PATH."""
    # Not resolved through symlinks: a venv's python links to the system one, yet only
    # the venv's path runs with the venv's packages.
    absolute = os.path.abspath(os.path.join(cwd, program))
    name = os.path.basename(absolute)
    found = shutil.which(name, path=environ.get("PATH"))
    return name if found and os.path.abspath(found) == absolute else absolute


def _torchrun(launch: Launch) -> list[str] | None:
    env = launch.environ
    if "TORCHELASTIC_RUN_ID" not in env or "LOCAL_WORLD_SIZE" not in env:
        return None
    local, world = int(env["LOCAL_WORLD_SIZE"]), int(env.get("WORLD_SIZE", env["LOCAL_WORLD_SIZE"]))
    beside_python = Path(launch.python).with_name("torchrun")
    program = [_on_path(str(beside_python), env)] if beside_python.is_file() else [_on_path(launch.python, env), "-m", "torch.distributed.run"]
    nodes = [f"--nnodes={world // local}"] if world > local else []
    return [*program, *nodes, f"--nproc-per-node={local}"]


def program_words(launch: Launch, torchrun: list[str] | None = None) -> list[str]:
    """The words that start the training program again, before the overrides
    (``torchrun``: the launcher's words, when the run was started by it)."""
    # "-c": `python -c "...main()"`, nothing to run again but the module.
    script = Path(os.path.abspath(os.path.join(launch.cwd, launch.argv0))) if launch.argv0 not in ("", "-c") else None
    is_cli = script is not None and script.suffix == ".py" and script.resolve() == _CLI_FILE
    installed = script is not None and any(part in ("site-packages", "dist-packages") for part in script.parts)
    if is_cli or script is None or (installed and script.suffix == ".py"):
        # `python -m optimus_preflight.cli`, or a launcher's own entry point (submitit):
        # the module is what to run again.
        entry = ["-m", CLI_MODULE]
    elif script.suffix == ".py":
        entry = [str(script)]  # a user's script calling MyRecipe.main()
    else:
        entry = []  # a console script: optimus-train itself
    if torchrun is not None:
        return [*torchrun, *entry] if entry else [*torchrun, "-m", CLI_MODULE]
    if entry:
        return [_on_path(launch.python, launch.environ), *entry]
    return [_on_path(launch.argv0, launch.environ, launch.cwd)]


def hydra_task_overrides() -> list[str]:
    """The user's overrides: those the app generated from the recipe class are generated
    again by the resumed run."""
    from optimus_preflight.config.recipe_config import is_generated_override

    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except Exception:  # not launched through the Hydra app
        return []
    return [o for o in overrides if not is_generated_override(o)]


def resume_command(run_dir: Path, overrides: Sequence[str] | None = None, launch: Launch | None = None) -> str:
    """The command that continues the run in ``run_dir``, as one shell line. It starts
    in the run's working directory: recipe modules and relative paths resolve there."""
    launch = launch or Launch.current()
    kept = [o for o in (hydra_task_overrides() if overrides is None else overrides) if not o.startswith(_REPLACED)]
    arguments = [*kept, f"hydra.run.dir={Path(run_dir).resolve()}", "checkpoint.resume=auto"]
    make_dir = launch.environ.get(MAKE_DIR_ENV)
    torchrun = _torchrun(launch)
    if make_dir and torchrun is None:
        # make hands ARGS to the shell unquoted, so quote each word inside it; `$` is
        # make's own expansion character. -C: it runs from any directory.
        inner = " ".join(shlex.quote(word) for word in arguments).replace("$", "$$")
        return shlex.join(["make", "-C", make_dir, "train", f"ARGS={inner}"])
    return f"cd {shlex.quote(os.path.abspath(launch.cwd))} && {shlex.join([*program_words(launch, torchrun), *arguments])}"
