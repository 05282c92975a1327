"""The Hydra app behind `optimus-train [overrides]` and `RecipeClass.main()`: overrides
checked before Hydra starts, the jobs, exit codes, sweeps and torchrun.

Overrides are composed and validated before Hydra starts the job, so a bad value
exits 2 with one message and no run directory is created for it. This module imports
no recipe: ``TrainRecipe.main()`` calls ``run_app`` with its class, and the console
script (cli.py) passes how to find the class a config names.

Why this module is long (~340 lines): what happens before Hydra (checks, the recipe's
declared config, torchrun's shared run dir) and the jobs' exit codes are one sequence.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from optimus_preflight.checkpoint.resume import check_resume_value
from optimus_preflight.checkpoint.signals import signal_number
from optimus_preflight.config.compose import DEFAULT_SOURCE, ConfigSource, compose, declared_overrides
from optimus_preflight.config.invocation import speaker
from optimus_preflight.config.reads import UnreadOverride
from optimus_preflight.config.registration import register_configs
from optimus_preflight.config.validate import validate_config
from optimus_preflight.errors import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USER_ERROR,
    PreflightFailed,
    TrainingInterrupted,
    UserError,
)
from optimus_preflight.preflight.defaults import check_disable_names
from optimus_preflight.reporting.run_log import log_to_files
from optimus_preflight.reporting.sweep_summary import already_completed, write_sweep_summary
from optimus_preflight.training.distributed import (
    DistEnv,
    broadcast_object,
    destroy_process_group,
    init_process_group,
    leave_together,
)
from optimus_preflight.training.error_context import bug_location
from optimus_preflight.training.training_context import resolve_plan

log = logging.getLogger("optimus_preflight")

CONFIG_PATH = "pkg://optimus_preflight.conf"

HELP_HEADER = """usage: {prog} [-m] [--cfg job] [--version] [--hydra-help] [KEY=VALUE ...]

Train a recipe, after a preflight that catches OOMs, hangs and silent mistraining.
Exit codes: 0 ok, 1 internal error, 2 user error (bad config, a run dir in use or full,
a dead or stalled data worker, a silent peer), 3 preflight failed, 128+signal after a clean stop
with a checkpoint.

  {prog} trainer.max_steps=500 optimizer.lr=1e-3
  {prog} preflight.only=true preflight.memory.target_gib=80
  {prog} -m optimizer.lr=1e-3,3e-4          # a sweep (-m before the overrides)
  {prog} hydra.run.dir=runs/a checkpoint.resume=auto

The keys of this recipe's config (KEY = default  what it does); pick a group's option
with GROUP=OPTION (optimizer=sgd, scheduler=warmup_cosine).
"""

HELP_FOOTER = """
--cfg job prints the composed config; Hydra's own options: --hydra-help. Docs: README.md."""


def _job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per value of every sweep: each value is checked once, without
    composing the whole cartesian product."""
    plain = [o for o in overrides if not _is_hydra_override(o) or o.lstrip("+").startswith("hydra.searchpath=")]
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


def check_override_syntax(overrides: list[str]) -> None:
    """Each override parsed on its own, so a syntax error names the one that has it
    (Hydra's own message names only the token it stopped at)."""
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parsed = parser.parse_override(override)
        except HydraException as error:
            reason = " ".join(str(error).split()).split(" See https://")[0]
            raise UserError(f"cannot parse the override {override!r}: {reason}", key=_override_key(override),
                            fix=_unclosed(override) + "Write it as key=value (+key=value adds a key, ~key removes "
                            "one); quote a value with brackets, braces, commas or $ in single quotes inside the "
                            "shell's: 'key=[1,2]', 'key=${other.key}'.") from None
        if not parsed.key_or_group:
            raise UserError(f"the override {override!r} has no key", key=None,
                            fix="Write it as key=value, e.g. trainer.max_steps=5.")


def _unclosed(override: str) -> str:
    """The fix for a list, dict or quote left open (``key=[0.9,0.95``): close it."""
    for opening, closing, what in (("[", "]", "list"), ("{", "}", "brace"), ("(", ")", "parenthesis")):
        if override.count(opening) > override.count(closing):
            return f"Close the {what} with {closing!r} ({override}{closing * (override.count(opening) - override.count(closing))}). "
    for quote in ("'", '"'):
        if override.count(quote) % 2:
            return f"Close the quote with {quote}. "
    return ""


def _override_key(override: str) -> str | None:
    return override.lstrip("+~").split("=", 1)[0] or None


def _is_hydra_override(override: str) -> bool:
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


RecipeResolver = Callable[[DictConfig], type]


def check_before_work(cfg: DictConfig) -> None:
    """Everything about a config that can be checked before a model, data or file is
    touched: the values, the device and precision against this machine, an explicit
    checkpoint path, the extra stop signal. Run before Hydra starts a job and by every
    recipe's constructor (a recipe built from Python never passes through the app)."""
    validate_config(cfg)
    check_disable_names(cfg.preflight.disable)  # a typo would skip nothing; the recipe's own checks are defined by now
    resolve_plan(cfg.trainer)  # impossible device/precision pairs
    check_resume_value(cfg.checkpoint.resume)  # an explicit path must exist
    if cfg.checkpoint.extra_signal:
        signal_number(cfg.checkpoint.extra_signal)


def check_overrides(overrides: list[str], multirun: bool, resolve: RecipeResolver | None,
                    source: ConfigSource = DEFAULT_SOURCE) -> None:
    """Every job's config, and the recipe class it names (when ``resolve`` is given),
    checked before Hydra starts: a bad value exits 2 before any run dir exists."""
    for job in _job_overrides(overrides, multirun):
        cfg = compose(job, source=source)
        if resolve is not None:
            resolve(cfg)
        check_before_work(cfg)


class SweepInterrupted(BaseException):
    """Stops Hydra's launcher: a BaseException passes through its per-job error capture.
    ``rerun``: whether running the same command again continues the sweep."""

    def __init__(self, exit_code: int, rerun: bool = True):
        self.exit_code = exit_code
        self.rerun = rerun
        super().__init__(exit_code)


def run_recipe(recipe_class: type, cfg: DictConfig, *, contain_bugs: bool = False,
               bug_lines: list[str] | None = None) -> int:
    """Run one job and map its outcome to an exit code.

    A bug propagates (Hydra prints the traceback, exit 1), except inside a sweep,
    where it is logged with its traceback and the sweep goes on (``contain_bugs``).
    Where a bug is in the user's code (a sample, a recipe method), one line naming it
    goes to ``bug_lines``, for the app to print after the traceback (``bug_location``).
    """
    try:
        recipe_class(cfg).run()
    except UnreadOverride as error:
        log.error("%s", error)
        if contain_bugs:
            raise  # a sweep over a key nobody reads: every job would be the same run
        return error.exit_code
    except UserError as error:
        log.error("%s", error)
        return error.exit_code
    except PreflightFailed as error:
        log.error("%s", error)
        return error.exit_code
    except TrainingInterrupted as error:
        if error.chained_handler is not None:
            # e.g. submitit: its handler requeues the job (and exits) now that the
            # checkpoint it will resume from is on disk.
            error.chained_handler(error.signum, None)
        return error.exit_code
    except Exception as error:
        where = bug_location(error, recipe_class)
        if not contain_bugs:
            # Hydra prints the traceback to the terminal only: train.log keeps it too.
            log_to_files(log, logging.ERROR, "job failed with an unexpected error (a bug in the recipe or the toolkit)", exc_info=True)
            if where is not None:
                log_to_files(log, logging.ERROR, where)
                if bug_lines is not None:
                    bug_lines.append(where)
            raise
        log.exception("job failed with an unexpected error (a bug: please report it)")
        if where is not None:
            log.error("%s", where)
        return EXIT_INTERNAL
    return EXIT_OK


def _with_default(argv: list[str], key: str, value: str) -> None:
    if not any(arg.lstrip("+").startswith(f"{key}=") for arg in argv):
        _add_overrides(argv, [f"{key}={value}"])


def _add_overrides(argv: list[str], new: list[str]) -> None:
    """Add overrides to the command line next to the user's: argparse takes the overrides
    as one run of positionals, so ``a=1 --cfg job`` plus an override appended at the end
    would be refused as an unrecognized argument."""
    if not new:
        return
    given = get_args_parser().parse_args(argv[1:]).overrides
    end = 1
    for index in range(len(argv) - len(given), 0, -1):
        if given and argv[index:index + len(given)] == given:
            end = index + len(given)
            break
    argv[end:end] = new


def _prepare_distributed(argv: list[str]) -> DistEnv:
    """Under torchrun every rank must use the same run dir, and only rank 0 writes files:
    rank 0 picks the timestamped dir and the others follow it."""
    env = DistEnv.from_environment()
    if not env.is_distributed:
        return env
    args = get_args_parser().parse_args(argv[1:])
    # One process group serves every job of a sweep: the first job's value sets its bound.
    first_job = compose(_job_overrides(args.overrides, args.multirun)[0], source=_source(args))
    init_process_group(env, timeout_s=first_job.trainer.dist_timeout_s)
    try:
        stamp = broadcast_object(datetime.now().strftime("%Y-%m-%d/%H-%M-%S"))
    except UserError as error:  # a rank that never came: one message, not a traceback
        print(f"{speaker()}: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    _with_default(argv, "hydra.run.dir", f"outputs/{stamp}")
    _with_default(argv, "hydra.sweep.dir", f"multirun/{stamp}")
    if not env.is_main:
        _add_overrides(argv, ["hydra.output_subdir=null", "hydra/job_logging=stdout"])
    return env


def _extra_signal_name(overrides: list[str]) -> str:
    for override in reversed(overrides):
        if override.startswith("checkpoint.extra_signal="):
            return override.split("=", 1)[1].removeprefix("SIG") or "USR1"
    return "USR1"


def _source(args: Any) -> ConfigSource:
    return ConfigSource(args.config_dir, args.config_path, args.config_name)


def _add_declared_config(argv: list[str], args: Any) -> None:
    """Add the overrides that select the recipe class's own model/data/defaults
    (config/recipe_config.py) to the command line Hydra parses, so the job, ``--cfg job``
    and ``.hydra/config.yaml`` all see the recipe's own config."""
    jobs = _job_overrides(args.overrides, args.multirun)
    declared = {tuple(declared_overrides(job, _source(args))) for job in jobs}
    if len(declared) > 1:
        raise UserError(
            "this sweep runs recipe classes that declare different configs",
            key="recipe",
            fix="Sweep one recipe class at a time (one -m command per recipe).",
        )
    _add_overrides(argv, list(declared.pop()) if declared else [])


def _print_help_and_exit(args: Any) -> None:
    """``--help``: every group and key of this recipe's config, with the schema's doc."""
    from optimus_preflight.config.help_text import config_help
    from optimus_preflight.config.registration import group_schemas

    cfg = compose(_job_overrides(args.overrides, False)[0] if not args.multirun else [], source=_source(args))
    from optimus_preflight.config.invocation import program

    print(HELP_HEADER.format(prog=program()))
    print(config_help(cfg, group_schemas()))
    print(HELP_FOOTER)
    sys.exit(EXIT_OK)


def _print_version_and_exit() -> None:
    from optimus_preflight.config.help_text import version_text

    print(version_text())
    sys.exit(EXIT_OK)


def _quit_at_once(signum: int, frame: Any) -> None:
    """Ctrl+C once the jobs are over: the process is on its way out (torch and
    multiprocessing join the data workers at exit), so it ends now, without a traceback."""
    os.write(2, f"{speaker()}: interrupted while exiting: stopped at once; checkpoints already on disk are intact.\n".encode())
    os._exit(128 + signal.SIGINT)


def _quit_at_once_from_any_thread() -> None:
    """A Ctrl+C the kernel hands to another thread than the main one does not wake a main
    thread blocked in a C call (a join, a sleep at exit), and Python runs its handler only
    on the main thread: a thread of ours reads the signal from the wakeup fd, which the
    C-level handler writes whichever thread received it, and ends the process itself."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        return

    def watch() -> None:
        while True:
            received = os.read(read, 64)
            if not received or signal.SIGINT in received:
                break
        if received:
            _quit_at_once(signal.SIGINT, None)

    threading.Thread(target=watch, name="optimus-exit-ctrl-c", daemon=True).start()


def _check_output_dir(overrides: list[str], multirun: bool) -> None:
    """An explicit ``hydra.run.dir`` (``hydra.sweep.dir`` under -m) that cannot be created
    is a storage error with the key named: Hydra creates it before any of our code runs,
    and would print a bare FileNotFoundError/PermissionError traceback."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [override.split("=", 1)[1] for override in overrides if override.startswith(f"{key}=")]
    if not given or "${" in given[-1]:
        return
    directory = Path(given[-1]).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{key}={given[-1]}: cannot create the directory ({error.strerror or error})",
                        key=key, fix=f"Point {key} at a directory this user can create and write.") from None


def run_app(recipe_class: type | None = None, resolve: RecipeResolver | None = None) -> None:
    """Run the app for ``recipe_class``, or for the class each job's ``recipe._target_``
    names, found by ``resolve``."""
    if (recipe_class is None) == (resolve is None):
        raise TypeError("run_app needs exactly one of recipe_class and resolve")
    # A console script does not put the working directory on sys.path; `python -m`
    # does, and users expect `recipe._target_=my_module.MyRecipe` to import from it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    register_configs()
    if recipe_class is not None:
        _with_default(sys.argv, "recipe._target_", f"{recipe_class.__module__}.{recipe_class.__qualname__}")
    if "--version" in sys.argv[1:]:  # this package's version, not Hydra's
        _print_version_and_exit()
    args = get_args_parser().parse_args(sys.argv[1:])
    try:
        check_override_syntax(args.overrides)
        _add_declared_config(sys.argv, args)
        args = get_args_parser().parse_args(sys.argv[1:])
        if args.help:
            _print_help_and_exit(args)
        if not (args.hydra_help or args.info or args.shell_completion):
            check_overrides(args.overrides, args.multirun, resolve, _source(args))
            _check_output_dir(args.overrides, args.multirun)
    except UserError as error:
        print(f"{speaker()}: error: {error}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    _prepare_distributed(sys.argv)
    # submitit sends its pre-timeout signal (USR2 unless told) and reads this at import:
    # make it the signal our handler saves a checkpoint on.
    os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", _extra_signal_name(args.overrides))

    exit_codes: list[int] = []
    bug_lines: list[str] = []  # where a bug in the user's code happened: the last line printed
    sweep_dirs: list[Path] = []
    stop_timeouts: list[float] = []

    @hydra.main(config_path=CONFIG_PATH, config_name="config", version_base="1.3")
    def _task(cfg: DictConfig) -> Any:
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if already_completed(run_dir, cfg):
            steps = f" {cfg.trainer.max_steps} steps" if cfg.trainer.max_steps else ""
            log.info("%s already completed%s: skipping (checkpoint.resume=auto)", run_dir, steps)
            exit_codes.append(EXIT_OK)
            return EXIT_OK
        cls = recipe_class or resolve(cfg)
        stop_timeouts.append(cfg.checkpoint.stop_timeout_s)
        try:
            code = run_recipe(cls, cfg, contain_bugs=args.multirun, bug_lines=bug_lines)
        except UnreadOverride as error:
            sweep_dirs.append(Path(hydra_cfg.sweep.dir))
            raise SweepInterrupted(error.exit_code, rerun=False) from None
        exit_codes.append(code)
        if args.multirun:
            sweep_dirs.append(Path(hydra_cfg.sweep.dir))
            if code >= 128:
                # Ctrl+C/SIGTERM in a sweep: this job saved its checkpoint; start no other.
                raise SweepInterrupted(code)
            if code and cfg.sweep.fail_fast:
                raise SweepInterrupted(code)
        return code

    try:
        try:
            _task()
        except Exception:  # HYDRA_FULL_ERROR=1 or a debugger: Hydra lets the bug through
            if not bug_lines:
                raise
            traceback.print_exc()
            sys.exit(EXIT_INTERNAL)
        finally:
            for line in bug_lines:  # after the traceback Hydra printed
                print(f"{speaker()}: {line}", file=sys.stderr, flush=True)
    except SweepInterrupted as stop:
        write_sweep_summary(sweep_dirs[-1])
        if stop.rerun:
            log.warning("sweep stopped early; re-run the same command with the same hydra.sweep.dir and checkpoint.resume=auto to continue")
        else:
            log.warning("sweep stopped before its first job trained: every job would have been the same run; fix the override above")
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        # Ctrl+C outside a run's handlers (starting up, or after its summary): no run to save.
        print(f"{speaker()}: interrupted: stopped at once; checkpoints already on disk are intact.", file=sys.stderr)
        sys.exit(130)
    finally:
        with contextlib.suppress(ValueError):  # off the main thread Python sets no handler
            signal.signal(signal.SIGINT, _quit_at_once)
            _quit_at_once_from_any_thread()
        if stop_timeouts and all(code == EXIT_OK or code >= 128 for code in exit_codes):  # jobs ran, and ended cleanly
            leave_together(stop_timeouts[-1])
        destroy_process_group()
    sys.exit(max(exit_codes, default=EXIT_OK))
