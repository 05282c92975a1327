"""The general preflight checks through a user's own recipe of another kind (a tabular
multi-output regressor, tests/multi_output_recipe.py) and the CLI: quiet when healthy, and
each planted bug named with its fix."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

TABULAR = ("recipe._target_=tests.multi_output_recipe.Tabular", "logging.progress=none", "preflight.only=true")


def warnings_of(run_dir) -> dict[str, dict]:
    report = json.loads((run_dir / "preflight.json").read_text())
    return {issue["code"]: issue for check in report["checks"] for issue in check["issues"]
            if issue["severity"] in ("warning", "error")}


@pytest.mark.slow
@pytest.mark.parametrize("override, code, words", [
    (None, None, None),
    ("data.standardise_targets=false", "TARGET_COLUMN_SCALES", "y.std(0)"),
    ("model.city_padding_idx=0", "EMBEDDING_PADDING_IDX", "Drop padding_idx"),
], ids=["healthy", "targets_in_their_units", "padding_idx_on_a_category"])
def test_a_tabular_recipe_is_quiet_or_gets_its_bug_named(tmp_path, override, code, words):
    result = run_cli(tmp_path / "run", *TABULAR, *([override] if override else []))
    assert result.returncode == 0, result.output
    found = warnings_of(tmp_path / "run")
    if code is None:
        assert found == {} and "ready to train" in result.output
    else:
        assert code in found and words in found[code]["fix"] and f"WARNING {code}" in result.output
