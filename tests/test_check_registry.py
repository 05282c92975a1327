"""A developer's mistake in a check class or a check list fails loudly when the class is
defined or the list registered: never as a crashed preflight or a silent skip."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import optimus_preflight.preflight
from optimus_preflight.preflight import DEFAULT_CHECKS, default_checks
from optimus_preflight.preflight.framework import Check, CheckDefinitionError, Stage, run_checks
from optimus_preflight.preflight.framework.issues import FRAMEWORK_CODES
from optimus_preflight.preflight.framework.registry import CODE_FORM, validate_checks
from tests.conftest import tiny_config


def _define(body: dict, name: str = "Defined", bases: tuple = (Check,), **keywords):
    """A check class made the way a module defines one, under a fresh qualname."""
    namespace = {"__module__": __name__, "__qualname__": name, "run": lambda self, ctx, findings: None}
    namespace.update(body)
    return type(name, bases, namespace, **keywords)


def test_a_check_without_a_name_is_refused_when_defined():
    with pytest.raises(CheckDefinitionError, match=r"has no name: set a class attribute such as name ="):
        _define({"stage": Stage.DATA}, "Nameless")


def test_a_check_without_a_stage_is_refused_when_defined():
    with pytest.raises(CheckDefinitionError, match=r"stage=None: set stage to one of Stage.ENVIRONMENT"):
        _define({"name": "test.stageless"}, "Stageless")


def test_a_misspelt_stage_is_refused_and_a_stage_string_is_accepted():
    with pytest.raises(CheckDefinitionError, match=r"stage='datta'"):
        _define({"name": "test.typo_stage", "stage": "datta"}, "TypoStage")
    assert _define({"name": "test.string_stage", "stage": "data"}, "StringStage").stage is Stage.DATA


def test_requires_given_as_one_string_is_refused():
    # ("data.first_batch") without the comma is a string: the runner would look up one letter at a time.
    with pytest.raises(CheckDefinitionError, match=r"such as \('data.first_batch',\)"):
        _define({"name": "test.str_requires", "stage": Stage.STEP, "requires": "data.first_batch"}, "StrRequires")


def test_a_check_without_run_is_refused():
    namespace = {"__module__": __name__, "__qualname__": "NoRun", "name": "test.no_run", "stage": Stage.DATA}
    with pytest.raises(CheckDefinitionError, match="does not implement run"):
        type("NoRun", (Check,), namespace)


def test_an_abstract_base_needs_no_name_and_its_subclasses_do():
    base = type("Base", (Check,), {"__module__": __name__, "__qualname__": "Base", "stage": Stage.MODEL},
                abstract=True)
    concrete = _define({"name": "test.concrete"}, "Concrete", (base,))
    assert concrete.stage is Stage.MODEL
    with pytest.raises(CheckDefinitionError, match="has no name"):
        _define({}, "ForgotName", (base,))


def test_two_check_classes_with_one_name_are_refused():
    with pytest.raises(CheckDefinitionError, match=r"two checks are named 'data.first_batch'.*FirstBatchCheck"):
        _define({"name": "data.first_batch", "stage": Stage.DATA}, "MyFirstBatch")


def test_a_subclass_keeping_its_parents_name_replaces_it():
    """The documented way to tune a default check: subclass it, keep the name, put it in the list."""
    first_batch = next(cls for cls in DEFAULT_CHECKS if cls.name == "data.first_batch")
    tuned = _define({}, "TunedFirstBatch", (first_batch,))
    validate_checks([tuned if cls is first_batch else cls for cls in DEFAULT_CHECKS])


def test_defining_the_same_class_again_is_not_a_duplicate():
    """A reloaded module or a re-run notebook cell defines the class a second time."""
    body = {"name": "test.redefined", "stage": Stage.CONFIG}
    _define(body, "Redefined")
    _define(body, "Redefined")


def test_one_name_twice_in_a_check_list_is_refused():
    check = _define({"name": "test.listed_twice", "stage": Stage.CONFIG}, "ListedTwice")
    with pytest.raises(CheckDefinitionError, match=r"holds 'test.listed_twice' twice"):
        run_checks([check(), check()], ctx=None)


def test_requiring_an_unknown_check_is_refused_with_the_likely_name():
    check = _define({"name": "test.needs_typo", "stage": Stage.STEP, "requires": ("first_batch",)}, "NeedsTypo")
    with pytest.raises(CheckDefinitionError, match=r"requires 'first_batch', which is no known check "
                                                   r"\(did you mean 'data.first_batch'\?\)"):
        validate_checks([check])


def test_requiring_a_check_of_a_later_stage_is_refused():
    check = _define({"name": "test.needs_later", "stage": Stage.DATA, "requires": ("step.first_step",)}, "NeedsLater")
    with pytest.raises(CheckDefinitionError, match=r"requires step.first_step of the later stage step"):
        validate_checks([check])


def test_requiring_a_check_listed_after_it_in_the_same_stage_is_refused():
    late = _define({"name": "test.late", "stage": Stage.CONFIG}, "Late")
    early = _define({"name": "test.early", "stage": Stage.CONFIG, "requires": ("test.late",)}, "Early")
    with pytest.raises(CheckDefinitionError, match=r"requires test.late, which comes after it in stage config"):
        validate_checks([early, late])
    validate_checks([late, early])


def test_a_recipe_appending_a_broken_check_fails_before_any_check_runs(monkeypatch):
    broken = _define({"name": "test.appended", "stage": Stage.ENVIRONMENT, "requires": ("data.first_batch",)},
                     "Appended")
    monkeypatch.setattr("optimus_preflight.preflight.defaults.DEFAULT_CHECKS", [*DEFAULT_CHECKS, broken])
    with pytest.raises(CheckDefinitionError, match="later stage data"):
        default_checks(tiny_config())


def test_the_shipped_check_list_is_valid_and_every_requirement_exists():
    validate_checks(DEFAULT_CHECKS)
    names = {cls.name for cls in DEFAULT_CHECKS}
    assert len(names) == len(DEFAULT_CHECKS)
    assert {needed for cls in DEFAULT_CHECKS for needed in cls.requires} <= names


def test_codes_given_as_one_string_or_in_lower_case_are_refused():
    with pytest.raises(CheckDefinitionError, match=r"codes='DP4': give a tuple .* such as \('DP4',\)"):
        _define({"name": "test.one_code", "stage": Stage.DATA, "codes": "DP4"}, "OneCode")
    with pytest.raises(CheckDefinitionError, match=r"give a tuple of the upper-case issue codes"):
        _define({"name": "test.lower_code", "stage": Stage.DATA, "codes": ("dp4",)}, "LowerCode")


# ----------------------------------------------- every code the shipped checks report is declared

PREFLIGHT = Path(optimus_preflight.preflight.__file__).parent
# Upper-case string literals of the preflight's source that are not issue codes.
NOT_CODES = {"LOCAL_WORLD_SIZE", "GPU", "MEM", "SIGALRM", "SIGUSR2", "T", "CRASH", "ERROR", "WARN", "WARNING",
             "DEFAULT_CHECKS", "CREDIT"}


def _upper_case_literals(path: Path) -> set[str]:
    """What the old regex read as codes: every upper-case string constant of a module."""
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE_FORM.fullmatch(node.value)}


def _shipped_checks() -> list[type[Check]]:
    """The check classes the checks/ modules define (the registry may hold a test's subclass
    under a shipped name)."""
    modules = [importlib.import_module(f"optimus_preflight.preflight.checks.{path.stem}")
               for path in sorted((PREFLIGHT / "checks").glob("*.py"))]
    return [value for module in modules for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, Check) and value.__module__ == module.__name__
            and value.__dict__.get("name")]


def test_each_check_module_reports_only_codes_its_checks_declare():
    assert set(DEFAULT_CHECKS) <= set(_shipped_checks())
    for path in sorted((PREFLIGHT / "checks").glob("*.py")):
        module = f"optimus_preflight.preflight.checks.{path.stem}"
        declared = {code for cls in _shipped_checks() if cls.__module__ == module for code in cls.codes}
        assert _upper_case_literals(path) - NOT_CODES - set(FRAMEWORK_CODES) <= declared, path.name


def test_every_code_in_the_preflight_source_is_declared_and_every_declared_code_is_reported_somewhere():
    literals = set().union(*(_upper_case_literals(path) for path in PREFLIGHT.rglob("*.py"))) - NOT_CODES
    declared = {code for cls in _shipped_checks() for code in cls.codes}
    assert literals - set(FRAMEWORK_CODES) - declared == set()
    assert declared - literals == set()  # no stale declaration
    assert set(FRAMEWORK_CODES) <= literals


def test_the_analyses_codes_are_declared_by_the_checks_that_report_them():
    """A helper in analyses/ reports on behalf of the check that calls it."""
    by_check = {cls.name: set(cls.codes) for cls in _shipped_checks()}
    assert {"O12", "O13", "O16"} <= by_check["step.loss_function"] and "O14" in by_check["step.targets"]
    assert "O15" in by_check["step.padded_loss"] and "O1" in by_check["step.initial_loss"]
    assert {"MEM1", "MEM2", "MEM3"} <= by_check["memory.vram_headroom"]


# ------------------------------------------------------------- preflight/ by role

ROLES = ["framework", "data_access", "analyses", "checks"]  # each imports only from those before it


def _runtime_imports(path: Path) -> set[str]:
    """Modules a file imports when it runs: an ``if TYPE_CHECKING:`` block names types only."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and getattr(block.test, "id", None) == "TYPE_CHECKING" for stmt in block.body for node in ast.walk(stmt)}
    return {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and id(node) not in skipped}


def test_the_preflight_roles_import_downwards_only():
    upward = []
    for rank, role in enumerate(ROLES):
        for path in sorted((PREFLIGHT / role).glob("*.py")):
            for module in _runtime_imports(path):
                parts = module.split(".")
                if parts[:2] == ["optimus_preflight", "preflight"] and len(parts) > 2:
                    target = parts[2]
                    if target not in ROLES[:rank + 1]:
                        upward.append(f"{role}/{path.name} -> {module}")
    assert not upward
