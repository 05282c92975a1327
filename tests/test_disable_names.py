"""preflight.disable names checks or issue codes: a typo is a user error before any work
(issue 13), not a list entry that silently skips nothing."""

from __future__ import annotations

import pytest

from optimus_preflight import compose
from optimus_preflight.errors import UserError
from optimus_preflight.preflight.defaults import check_disable_names
from optimus_preflight.preflight.framework import Check, Stage, known_codes
from optimus_preflight.recipe import TrainRecipe
from tests.conftest import tiny_config


class ProjectCheck(Check):
    """A check of the user's own, as a recipe's module defines one."""

    name = "project.vocab_size"
    stage = Stage.CONFIG
    codes = ("PROJECT_VOCAB",)

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


def test_every_code_a_check_declares_is_known_with_the_checks_that_declare_it():
    known = known_codes()
    assert {"O8", "DP15", "ENV_LOW_RAM", "MEM6", "PRECISION_CPU_FP16", "ENV_WORKERS", "PROJECT_VOCAB"} <= set(known)
    assert set(known["DP15"]) == {"env.shared_memory", "data.loader_memory"}
    assert known["PROJECT_VOCAB"] == ["project.vocab_size"] and "DATA_TIMEOUT" in known


@pytest.mark.parametrize("entry", ["RANK", "CUDA", "PATH", "T"])
def test_an_upper_case_word_of_the_source_that_no_check_declares_is_refused(entry):
    """A regex over the source once accepted these: quoted upper-case words that are env
    variables or device names, not issue codes, so the entry skipped nothing."""
    with pytest.raises(UserError, match=f"preflight.disable: '{entry}' is neither"):
        check_disable_names([entry])


def test_a_code_a_check_reports_without_declaring_it_is_refused():
    class Undeclared(Check):
        name = "project.undeclared"
        stage = Stage.CONFIG

        def run(self, ctx, findings):
            findings.warning("PROJECT_UNDECLARED", "found", "fix")

    with pytest.raises(UserError, match="a check's issue codes are its `codes` attribute"):
        check_disable_names(["PROJECT_UNDECLARED"])


def test_close_matches_are_listed():
    with pytest.raises(UserError) as caught:
        check_disable_names(["MEM7"])
    assert "Did you mean MEM" in str(caught.value) and "Other close matches: MEM" in str(caught.value)


def test_a_misspelt_check_name_suggests_the_check_and_the_list_to_write():
    with pytest.raises(UserError) as caught:
        check_disable_names(["O6", "step.thruput"])
    text = str(caught.value)
    assert text.startswith("preflight.disable: 'step.thruput' is neither a preflight check nor an issue code a check declares")
    assert "Did you mean step.throughput? Set preflight.disable=[O6,step.throughput]" in text
    assert "optimus-train preflight.only=true" in text and "\n" not in text


@pytest.mark.parametrize(("entry", "guess"), [("DP155", "DP15"), ("dp15", "DP15"), ("Step.Throughput", "step.throughput")])
def test_a_misspelt_issue_code_suggests_the_code(entry, guess):
    with pytest.raises(UserError, match=f"Did you mean {guess}\\?"):
        check_disable_names([entry])


def test_an_entry_like_nothing_known_shows_an_example_list():
    with pytest.raises(UserError, match=r"e\.g\. preflight\.disable=\[step\.throughput,O6\]"):
        check_disable_names(["zzzzzz"])


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
