"""The preflight framework: policy, isolation, the console and JSON reports, the default
check list on the shipped recipes, and the ranks' agreement on the verdict."""

from __future__ import annotations

import json
import logging
import multiprocessing

import pytest

from optimus_preflight.preflight import DEFAULT_CHECKS, default_checks, format_report
from optimus_preflight.preflight.framework import Check, CheckResult, CheckStatus, Issue, Severity, Stage
from optimus_preflight.preflight.framework.consensus import (
    agree_on_verdict,
    duplicated_rank_pairs,
    merge_rank_payloads,
    rank_payload,
)
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.framework.runner import run_preflight_checks
from tests.conftest import tiny_config
from tests.preflight_support import make_recipe


class Warns(Check):
    name = "test.warns"
    stage = Stage.CONFIG
    codes = ("TEST_WARN",)

    def run(self, ctx, findings):
        findings.warning("TEST_WARN", "something to look at", "look at it", "trainer.max_steps")


class Fails(Check):
    name = "test.fails"
    stage = Stage.DATA
    codes = ("TEST_ERR",)

    def run(self, ctx, findings):
        findings.error("TEST_ERR", "something broken", "fix it")


class Crashes(Check):
    name = "test.crashes"
    stage = Stage.ENVIRONMENT

    def run(self, ctx, findings):
        raise ZeroDivisionError("boom")


class NeedsFails(Check):
    name = "test.needs_fails"
    stage = Stage.STEP
    requires = ("test.fails",)

    def run(self, ctx, findings):
        raise AssertionError("must not run")


def _report(tmp_path, checks, *overrides):
    recipe = make_recipe(tmp_path, *overrides)
    return run_preflight_checks(checks, PreflightContext.from_recipe(recipe)), tmp_path / "run" / "preflight.json"


@pytest.mark.parametrize(("fail_on", "checks", "status"), [
    ("error", [Warns()], "warnings"),
    ("warning", [Warns()], "failed"),
    ("error", [Fails()], "failed"),
    ("never", [Fails(), Warns()], "warnings"),
    ("error", [], "passed"),
])
def test_verdict_follows_fail_on(tmp_path, fail_on, checks, status):
    report, path = _report(tmp_path, checks, f"preflight.fail_on={fail_on}")
    assert report.status == status
    assert json.loads(path.read_text())["status"] == status


def test_disable_by_check_name_or_issue_code(tmp_path):
    report, _ = _report(tmp_path, [Warns(), Fails()], "preflight.disable=[test.fails,TEST_WARN]")
    assert report.check("test.fails").status == CheckStatus.SKIPPED
    assert report.check("test.warns").status == CheckStatus.PASSED
    assert report.status == "passed"


def test_a_crashing_check_is_isolated_and_its_dependents_skipped(tmp_path):
    report, path = _report(tmp_path, [NeedsFails(), Crashes(), Fails(), Warns()])
    assert [c.name for c in report.checks] == ["test.crashes", "test.warns", "test.fails", "test.needs_fails"]
    crashed = report.check("test.crashes")
    assert crashed.status == CheckStatus.CRASHED and "ZeroDivisionError: boom" in crashed.detail
    assert report.check("test.needs_fails").status == CheckStatus.SKIPPED
    payload = json.loads(path.read_text())
    assert set(payload) >= {"status", "elapsed_s", "checks"}
    entry = next(c for c in payload["checks"] if c["name"] == "test.warns")
    assert set(entry) >= {"name", "stage", "status", "elapsed_s", "issues", "data"}
    assert entry["issues"] == [{"code": "TEST_WARN", "severity": "warning", "message": "something to look at",
                                "fix": "look at it", "config_key": "trainer.max_steps"}]


def test_console_shows_the_count_then_issues_with_fixes_then_skips_then_the_verdict(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        report, path = _report(tmp_path, [Warns(), Fails(), Crashes(), NeedsFails()])
    text = format_report(report, path)
    lines = text.splitlines()
    assert lines[0].startswith("preflight: 4 checks: 0 passed, 1 with warnings, 1 with errors, 1 crashed, 1 skipped (")
    assert lines[1].split()[:2] == ["CRASH", "test.crashes"]  # a crash is no issue: its line stays
    assert lines.index("issues:") == 2
    assert any(line.strip() == "ERROR TEST_ERR [test.fails] something broken" for line in lines)
    assert "fix: fix it" in text and "fix (trainer.max_steps): look at it" in text
    assert "  skipped test.needs_fails: requires test.fails, which did not pass" in lines
    assert lines[-1].startswith("preflight FAILED") and str(path) in lines[-1]
    assert "training will not start" in lines[-1]
    logged = [r.getMessage() for r in caplog.records if r.name == "optimus_preflight"]
    assert logged[-len(lines):] == lines  # the same text went through the optimus_preflight logger
    assert any(r.levelno == logging.ERROR and "TEST_ERR" in r.getMessage() for r in caplog.records)


def test_verbose_console_has_a_line_for_every_check(tmp_path):
    report, path = _report(tmp_path, [Warns(), Fails(), Crashes(), NeedsFails()])
    lines = format_report(report, path, verbose=True).splitlines()
    labels = {line.split()[1]: line.split()[0] for line in lines[1:5]}
    assert labels == {"test.crashes": "CRASH", "test.warns": "WARN", "test.fails": "ERROR", "test.needs_fails": "skip"}
    assert not any(line.startswith("  skipped") for line in lines)  # the skip is among the check lines


def test_default_checks_follow_the_config(tiny_cfg):
    names = [check.name for check in default_checks(tiny_cfg)]
    assert len(names) == len(set(names))
    assert "step.overfit" not in names and "step.accumulation" not in names
    tiny_cfg.preflight.overfit_steps = 5
    tiny_cfg.trainer.accumulation_steps = 2
    assert {"step.overfit", "step.accumulation"} <= {check.name for check in default_checks(tiny_cfg)}
    assert all(issubclass(cls, Check) for cls in DEFAULT_CHECKS)


@pytest.mark.parametrize("overrides", [("recipe=char_lm_tiny",), ()], ids=["tiny", "default"])
def test_shipped_recipes_pass_the_default_preflight_without_warnings(tmp_path, overrides):
    from optimus_preflight import compose
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    recipe = CharLMRecipe(compose([*overrides, "logging.progress=none"]), run_dir=tmp_path)
    report = recipe.preflight()
    assert report.status == "passed"
    assert all(check.status == CheckStatus.PASSED for check in report.checks), [
        (c.name, c.status, c.detail, [i.message for i in c.issues]) for c in report.checks if c.status != "passed"
    ]
    assert recipe.preflight_report is report and (tmp_path / "preflight.json").is_file()


def test_preflight_disabled_runs_no_check(tmp_path):
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    recipe = CharLMRecipe(tiny_config("preflight.enabled=false", "trainer.max_steps=1", "trainer.eval_every_n_steps=0",
                                      "checkpoint.every_n_steps=0"), run_dir=tmp_path)
    assert recipe.run()["status"] == "completed"
    assert recipe.preflight_report is None and not (tmp_path / "preflight.json").exists()


# ------------------------------------------------------------------ ranks
def _report_with(*issues: Issue) -> PreflightReport:
    return PreflightReport([CheckResult("data.first_batch", Stage.DATA, CheckStatus.PASSED, 0.0, list(issues))])


def test_every_rank_gets_the_other_ranks_failures():
    hang = Issue("DATA_TIMEOUT", Severity.ERROR, "no first batch", "num_workers=0")
    payloads = [rank_payload(0, _report_with(), ["a", "b"]), rank_payload(1, _report_with(hang), ["c", "d"])]
    merged = merge_rank_payloads(0, payloads)
    assert merged.status == CheckStatus.ERROR and merged.issues[0].message.startswith("rank 1, data.first_batch")
    assert merge_rank_payloads(1, payloads).issues == []  # rank 1 has its own issue already
    assert merge_rank_payloads(0, payloads[:1]) is None  # a single process: nothing to add


def test_ranks_reading_the_same_samples_are_found():
    assert duplicated_rank_pairs({0: ["a", "b", "c"], 1: ["a", "b", "x"], 2: ["y", "z", "w"]}) == [(0, 1, 2 / 3)]
    merged = merge_rank_payloads(0, [rank_payload(0, _report_with(), ["a", "b"]), rank_payload(1, _report_with(), ["a", "b"])])
    assert {issue.code for issue in merged.issues} == {"DP2"}


def test_agreement_is_a_no_op_in_a_single_process():
    report = _report_with()
    assert agree_on_verdict(report, 0, ["a"]) is report and len(report.checks) == 1


def _rank_main(rank, init_file, queue):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    issues = [Issue("DATA_TIMEOUT", Severity.ERROR, "hung", "fix")] if rank == 1 else []
    report = agree_on_verdict(_report_with(*issues), rank, [f"sample-{rank}"])
    queue.put((rank, report.status))
    dist.destroy_process_group()


def test_two_ranks_reach_the_same_verdict_over_gloo(tmp_path):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=_rank_main, args=(rank, tmp_path / "init", queue)) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [p.exitcode for p in processes] == [0, 0]
    assert sorted(queue.get(timeout=5) for _ in processes) == [(0, "failed"), (1, "failed")]
