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
