"""Overrides the app adds to the command line (the recipe's declared config, defaults)
go next to the user's, wherever the user put flags such as ``--cfg job``."""

from __future__ import annotations

import sys

import pytest

from optimus_preflight.app import _add_overrides
from optimus_preflight.config.registration import register_configs


@pytest.mark.parametrize("argv, expected", [
    (["prog", "a=1", "--cfg", "job"], ["prog", "a=1", "new=1", "--cfg", "job"]),
    (["prog", "--cfg", "job", "a=1"], ["prog", "--cfg", "job", "a=1", "new=1"]),
    (["prog", "--cfg", "job"], ["prog", "new=1", "--cfg", "job"]),
    (["prog", "-m", "a=1,2", "--config-dir", "d"], ["prog", "-m", "a=1,2", "new=1", "--config-dir", "d"]),
])
def test_added_overrides_join_the_users_run_of_overrides(argv, expected):
    register_configs()
    _add_overrides(argv, ["new=1"])
    assert argv == expected


@pytest.mark.parametrize(("argv0", "expected"), [
    ("/abs/.venv/bin/optimus-train", "optimus-train"),
    ("/abs/optimus_preflight/cli.py", "optimus-train"),        # python -m optimus_preflight.cli, torchrun
    ("/abs/project/my_recipes.py", "python my_recipes.py"),    # MyRecipe.main() in a script of one's own
])
def test_messages_name_the_program_the_user_ran(monkeypatch, argv0, expected):
    from optimus_preflight.config.invocation import program

    monkeypatch.setattr(sys, "argv", [argv0, "trainer.max_steps=1"])
    assert program() == expected


@pytest.mark.parametrize(("argv0", "expected"), [
    ("/abs/.venv/bin/optimus-train", "optimus-train"),
    ("/abs/optimus_preflight/cli.py", "optimus-train"),
    ("/abs/project/my_recipes.py", "my_recipes.py"),
])
def test_stderr_lines_start_with_the_program_the_user_ran(monkeypatch, argv0, expected):
    from optimus_preflight.checkpoint.forced_exit import second_ctrl_c_message
    from optimus_preflight.config.invocation import speaker

    monkeypatch.setattr(sys, "argv", [argv0])
    assert speaker() == expected
    assert second_ctrl_c_message(None, "resume").startswith(f"{expected}: interrupted twice")


def test_an_output_dir_that_cannot_be_created_is_a_user_error_naming_the_key(tmp_path):
    from optimus_preflight.app import _check_output_dir
    from optimus_preflight.errors import UserError

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"hydra\.run\.dir=.*a_file/run: cannot create the directory"):
        _check_output_dir([f"hydra.run.dir={blocker}/run"], multirun=False)
    with pytest.raises(UserError, match=r"hydra\.sweep\.dir"):
        _check_output_dir([f"hydra.sweep.dir={blocker}/sweep"], multirun=True)
    _check_output_dir([f"hydra.run.dir={tmp_path}/fine"], multirun=False)
    assert (tmp_path / "fine").is_dir()
