"""The Hydra app: `optimus-train [overrides]`, `RecipeClass.main()`, and exit codes.

Overrides are composed and validated before Hydra starts the job, so a bad value
exits 2 with one message and no run directory is created for it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from optimus_preflight.config.compose import compose
from optimus_preflight.config.store import register_configs
from optimus_preflight.errors import (
    EXIT_OK,
    EXIT_USER_ERROR,
    PreflightFailed,
    TrainingInterrupted,
    UserError,
)
from optimus_preflight.instantiate import locate
from optimus_preflight.recipe import check_before_work

log = logging.getLogger("optimus_preflight")

CONFIG_PATH = "pkg://optimus_preflight.conf"


def resolve_recipe_class(cfg: DictConfig) -> type:
    from optimus_preflight.recipe import TrainRecipe

    target = cfg.recipe._target_
    recipe_class = locate(target, "recipe._target_")
    if not (isinstance(recipe_class, type) and issubclass(recipe_class, TrainRecipe)):
        raise UserError(
            f"recipe._target_={target!r} is not a TrainRecipe subclass",
            key="recipe._target_",
            fix="Point recipe._target_ at a class deriving from optimus_preflight.TrainRecipe.",
        )
    return recipe_class


def _job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per value of every sweep: each value is checked once, without
    composing the whole cartesian product."""
    plain = [o for o in overrides if not _is_hydra_override(o)]
    if not multirun:
        return [plain]
    parsed = OverridesParser.create().parse_overrides(plain)
    sweeps = [(i, list(o.sweep_string_iterator())) for i, o in enumerate(parsed) if o.is_sweep_override()]
    base = [o.input_line for o in parsed]
    for index, values in sweeps:
        base[index] = f"{parsed[index].get_key_element()}={values[0]}"
    jobs = [list(base)]
    for index, values in sweeps:
        for value in values[1:]:
            job = list(base)
            job[index] = f"{parsed[index].get_key_element()}={value}"
            jobs.append(job)
    return jobs


def _is_hydra_override(override: str) -> bool:
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def check_overrides(overrides: list[str], multirun: bool, recipe_class: type | None) -> None:
    for job in _job_overrides(overrides, multirun):
        cfg = compose(job)
        if recipe_class is None:
            resolve_recipe_class(cfg)
        check_before_work(cfg)


class SweepInterrupted(BaseException):
    """Stops Hydra's launcher: a BaseException passes through its per-job error capture."""

    def __init__(self, exit_code: int):
        self.exit_code = exit_code
        super().__init__(exit_code)


def run_recipe(recipe_class: type, cfg: DictConfig) -> int:
    """Run one job and map its outcome to an exit code (a bug propagates: traceback, 1)."""
    try:
        recipe_class(cfg).run()
    except UserError as error:
        log.error("%s", error)
        return error.exit_code
    except PreflightFailed as error:
        log.error("%s", error)
        return error.exit_code
    except TrainingInterrupted as error:
        return error.exit_code
    return EXIT_OK


def run_app(recipe_class: type | None = None) -> None:
    # A console script does not put the working directory on sys.path; `python -m`
    # does, and users expect `recipe._target_=my_module.MyRecipe` to import from it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    register_configs()
    if recipe_class is not None and not any(a.startswith("recipe._target_=") for a in sys.argv[1:]):
        sys.argv.append(f"recipe._target_={recipe_class.__module__}.{recipe_class.__qualname__}")
    args = get_args_parser().parse_args(sys.argv[1:])
    if not (args.help or args.hydra_help or args.info or args.shell_completion):
        try:
            check_overrides(args.overrides, args.multirun, recipe_class)
        except UserError as error:
            print(f"optimus-train: error: {error}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    exit_codes: list[int] = []

    @hydra.main(config_path=CONFIG_PATH, config_name="config", version_base="1.3")
    def _task(cfg: DictConfig) -> Any:
        cls = recipe_class or resolve_recipe_class(cfg)
        code = run_recipe(cls, cfg)
        exit_codes.append(code)
        if code >= 128 and args.multirun:
            # Ctrl+C/SIGTERM in a sweep: this job saved its checkpoint; start no other.
            raise SweepInterrupted(code)
        return code

    try:
        _task()
    except SweepInterrupted as stop:
        log.warning("sweep stopped by a signal; re-run the same command with checkpoint.resume=auto to continue")
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        print("optimus-train: interrupted twice: stopped at once; the last checkpoint on disk is intact.", file=sys.stderr)
        sys.exit(130)
    sys.exit(max(exit_codes, default=EXIT_OK))


def main() -> None:
    run_app()


if __name__ == "__main__":
    main()
