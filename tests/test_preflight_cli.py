"""preflight.only=true through the real CLI: the report, then exit 0 or 3 without training."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_preflight_only_exits_0_when_passing_and_3_when_failing(cli, tmp_path):
    passed = cli("recipe=char_lm_tiny", "preflight.only=true", "logging.progress=none", run_dir=tmp_path / "ok")
    assert passed.returncode == 0, passed.output
    assert json.loads((passed.run_dir / "preflight.json").read_text())["status"] == "passed"
    assert "preflight PASSED" in passed.output
    assert not (passed.run_dir / "metrics.jsonl").exists()  # it did not train
    assert "starting fresh" not in passed.output  # nor did it start anything

    failed = cli("recipe=char_lm_tiny", "preflight.only=true", "logging.progress=none", "preflight.fail_on=warning",
                 "data.shuffle=false", run_dir=tmp_path / "bad")
    assert failed.returncode == 3, failed.output
    report = json.loads((failed.run_dir / "preflight.json").read_text())
    assert report["status"] == "failed"
    assert any(issue["code"] == "DP14" for check in report["checks"] for issue in check["issues"])
    assert "fix (data.shuffle)" in failed.output and "Traceback" not in failed.output
    assert failed.summary()["status"] == "preflight_failed"
