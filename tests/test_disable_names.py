"""preflight.disable names checks or issue codes: a typo is a user error before any work
(issue 13), not a list entry that silently skips nothing."""

from __future__ import annotations

import pytest

from optimus_preflight import compose
from optimus_preflight.errors import UserError
from optimus_preflight.preflight import defaults
from optimus_preflight.preflight.defaults import check_disable_names, issue_codes
from optimus_preflight.preflight.framework import Check, Stage
from optimus_preflight.recipe import TrainRecipe
from tests.conftest import tiny_config


class ProjectCheck(Check):
    """A check of the user's own, as a recipe's module defines one."""

    name = "project.vocab_size"
    stage = Stage.CONFIG

    def run(self, ctx, findings):
        findings.warning("PROJECT_VOCAB", "the vocabulary is small", "grow it")


class ProjectRecipe(TrainRecipe):
    def preflight_checks(self):
        return [*super().preflight_checks(), ProjectCheck()]


@pytest.mark.parametrize("disable", [
    [],
    ["step.throughput", "env.disk_space"],
    ["O6", "DP15", "ENV_DISK", "MEM1", "GRAD_NONE"],  # issue codes, some reported through helper modules
    ["step.lr_finder"],  # a check the config leaves out of this run is still a check
    ["project.vocab_size", "PROJECT_VOCAB"],  # a recipe's own check and code
])
def test_check_names_and_issue_codes_are_accepted(disable):
    check_disable_names(disable)


def test_every_code_a_check_reports_is_known():
    assert {"O8", "DP15", "ENV_LOW_RAM", "MEM6", "PRECISION_CPU_FP16", "ENV_WORKERS", "PROJECT_VOCAB"} <= issue_codes()


def test_a_misspelt_check_name_suggests_the_check_and_the_list_to_write():
    with pytest.raises(UserError) as caught:
        check_disable_names(["O6", "step.thruput"])
    text = str(caught.value)
    assert text.startswith("preflight.disable: 'step.thruput' is neither a preflight check nor an issue code")
    assert "Did you mean step.throughput? Set preflight.disable=[O6,step.throughput]" in text
    assert "optimus-train preflight.only=true" in text and "\n" not in text


# Built, not quoted: a quoted upper-case token in this package's source counts as a known code.
@pytest.mark.parametrize(("entry", "guess"), [(f"DP{155}", "DP15"), ("dp15", "DP15"), ("Step.Throughput", "step.throughput")])
def test_a_misspelt_issue_code_suggests_the_code(entry, guess):
    with pytest.raises(UserError, match=f"Did you mean {guess}\\?"):
        check_disable_names([entry])


def test_an_entry_like_nothing_known_shows_an_example_list():
    with pytest.raises(UserError, match=r"e\.g\. preflight\.disable=\[step\.throughput,O6\]"):
        check_disable_names(["zzzzzz"])


def test_without_every_checks_source_a_dotted_typo_is_still_refused(monkeypatch):
    """A check defined in a notebook cell has no source to read its codes from."""
    monkeypatch.setattr(defaults, "issue_codes", lambda: None)
    check_disable_names(["ANY_CODE"])
    with pytest.raises(UserError, match="step.throughput"):
        check_disable_names(["step.thruput"])


def test_a_recipe_refuses_the_typo_before_touching_anything(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError, match="Did you mean step.throughput"):
        ProjectRecipe(tiny_config("preflight.disable=[step.thruput]"), run_dir=run_dir)
    assert not run_dir.exists()
    ProjectRecipe(tiny_config("preflight.disable=[project.vocab_size]"), run_dir=run_dir)


def test_a_string_where_the_list_goes_shows_the_list_syntax():
    with pytest.raises(UserError) as caught:
        compose(["preflight.disable=step.throughput"])
    text = str(caught.value)
    assert text.startswith("preflight.disable takes a list, got 'step.throughput'")
    assert "preflight.disable=[step.throughput]" in text and "\n" not in text


@pytest.mark.slow
def test_cli_typo_exits_2_with_a_suggestion_and_no_traceback(cli):
    result = cli("preflight.disable=[step.thruput]", "preflight.only=true")
    assert result.returncode == 2, result.output
    assert "did you mean step.throughput?" in result.stderr.lower()
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    assert not result.run_dir.exists()
