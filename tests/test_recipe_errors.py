"""Errors in a user's own recipe code: where they are, not a wrong hint; and a builder's
traceback kept in train.log."""

from __future__ import annotations

import sys
import textwrap

import pytest

from optimus_preflight.config.instantiate import locate
from optimus_preflight.errors import UserError
from tests.conftest import run_cli

BROKEN_MODULES = {
    "uses_undefined": """
        def helper():
            return undefined_name

        VALUE = helper()

        class MyRecipe:
            pass
    """,
    "imports_missing": """
        import json
        import not_a_real_package_xyz

        class MyRecipe:
            pass
    """,
    "cannot_parse": """
        class MyRecipe:
            def f(self:
                pass
    """,
}


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    for name, source in BROKEN_MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    (tmp_path / "fine.py").write_text("class MyRecipe:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [*BROKEN_MODULES, "fine"]:
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("module", "error", "line"), [
    ("uses_undefined", "NameError: name 'undefined_name' is not defined", 3),
    ("imports_missing", "ModuleNotFoundError: No module named 'not_a_real_package_xyz'", 3),
    ("cannot_parse", "SyntaxError", 3),
])
def test_an_error_inside_the_module_is_shown_with_its_file_and_line(user_modules, module, error, line):
    with pytest.raises(UserError) as caught:
        locate(f"{module}.MyRecipe", "recipe._target_")
    text = str(caught.value)
    assert error in text
    assert f"{user_modules / module}.py:{line}" in text
    assert "full import path" not in text  # the path resolves: that hint would mislead
    assert "importlib" not in text  # only the user's frames
    if module == "imports_missing":
        assert "install not_a_real_package_xyz" in text


def test_a_path_that_does_not_resolve_keeps_the_import_path_hint(user_modules):
    for path in ("no_such_module.MyRecipe", "fine.NoSuchClass"):
        with pytest.raises(UserError, match="full import path"):
            locate(path, "recipe._target_")


@pytest.mark.slow
def test_the_cli_shows_the_error_in_the_recipe_module_before_any_run_dir(tmp_path, user_modules):
    result = run_cli(tmp_path / "run", "recipe._target_=uses_undefined.MyRecipe", cwd=user_modules)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert "uses_undefined.py:3" in result.stderr and "NameError" in result.stderr
    assert not (tmp_path / "run").exists()


FAILING_BUILDER = """
from optimus_preflight.recipes.char_lm import CharLMRecipe


class MyRecipe(CharLMRecipe):
    def build_model(self):
        model = super().build_model()
        return model.no_such_attribute
"""


@pytest.mark.slow
def test_a_builder_bug_leaves_its_traceback_in_train_log(tmp_path):
    (tmp_path / "failing_builder.py").write_text(FAILING_BUILDER)
    result = run_cli(tmp_path / "run", "recipe=char_lm_tiny", "logging.progress=none", "recipe._target_=failing_builder.MyRecipe", cwd=tmp_path)
    assert result.returncode == 1, result.output
    log = (tmp_path / "run" / "train.log").read_text()
    assert "failed after 0 steps" in log
    assert "Traceback (most recent call last)" in log
    assert f'{tmp_path / "failing_builder.py"}", line 8, in build_model' in log
    assert "AttributeError" in log and "no_such_attribute" in log
    # The terminal gets the traceback once (Hydra's), not a second copy from the log.
    assert result.output.count("no_such_attribute") <= 3, result.output
