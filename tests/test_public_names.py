"""The names docs/ARCHITECTURE.md calls public, and every dotted path a config saved by an
earlier release can hold, keep working after the package was regrouped by layer."""

from __future__ import annotations

import importlib

import pytest

from optimus_preflight.config.instantiate import locate
from tests.conftest import REPO

# _target_ strings the shipped configs and schemas have held (conf/, config/schema.py).
SAVED_TARGETS = [
    "optimus_preflight.optim.warmup_cosine",
    "optimus_preflight.optim.constant",
    "optimus_preflight.sweep.SweepSummaryCallback",
    "optimus_preflight.recipes.char_lm.CharLMRecipe",
    "optimus_preflight.recipes.char_lm.CharTransformer",
    "optimus_preflight.recipes.char_lm.stdlib_char_windows",
]

PUBLIC = {
    "optimus_preflight": ["TrainRecipe", "compose", "UserError", "PreflightFailed", "TrainingInterrupted"],
    "optimus_preflight.callbacks": ["Callback"],
    "optimus_preflight.mixins": ["TrainingContextMixin", "PreflightMixin", "TrainingIterationMixin",
                                 "TrainingInterruptionMixin"],
    "optimus_preflight.preflight": ["PreflightReport", "Check", "DEFAULT_CHECKS", "default_checks", "run_preflight"],
    "optimus_preflight.preflight.loader_startup": ["check_first_batch", "LoaderSettings"],
    "optimus_preflight.memory": ["meta_param_count", "shape_param_count", "base_model_param_count",
                                 "bytes_per_weight", "estimate_step_memory", "check_gpu_step", "measure_gpu_step",
                                 "OOMRecorder"],
    "optimus_preflight.training.loaders": ["build_loader", "ResumableSampler"],
    "optimus_preflight.compat.credit": ["estimate_dataloader_memory_gib", "check_dataloader_startup",
                                        "check_model_gpu_memory"],
    "optimus_preflight.compat.nss": ["param_count_from_empty_model", "estimate_params_from_shape",
                                     "estimate_base_model_params", "bytes_per_base_weight"],
    "optimus_preflight.compat.composer": ["OOMObserver"],
}


@pytest.mark.parametrize("target", SAVED_TARGETS)
def test_a_saved_config_target_still_resolves(target):
    assert callable(locate(target, "test"))


def test_the_old_paths_are_the_same_objects_as_the_new_and_no_change_on_resume():
    from optimus_preflight.config.changes import config_changes
    from optimus_preflight.reporting import sweep_summary
    from optimus_preflight.training import optim as training_optim

    assert locate("optimus_preflight.optim.warmup_cosine", "test") is training_optim.warmup_cosine
    assert locate("optimus_preflight.sweep.SweepSummaryCallback", "test") is sweep_summary.SweepSummaryCallback
    saved = {"scheduler": {"_target_": "optimus_preflight.optim.constant", "warmup_steps": 0}}
    current = {"scheduler": {"_target_": "optimus_preflight.training.optim.constant", "warmup_steps": 0}}
    assert config_changes(saved, current) == {}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_names_import(module):
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_recipe_main_and_the_console_script_exist():
    from optimus_preflight import TrainRecipe, cli

    assert callable(TrainRecipe.main) and callable(cli.main)


def test_a_non_editable_install_ships_every_subpackage():
    """pyproject lists the packages by hand: a new folder missing from the list would work
    in the editable checkout and be absent from a wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from tests.conftest import REPO

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(path.parent.relative_to(REPO).parts) for path in (REPO / "optimus_preflight").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)


def _documented_public_names() -> dict[str, list[str]]:
    """The "Public API" list of docs/ARCHITECTURE.md: "- `module`: `Name`, `Name`"."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Public API", 1)[1].split("\n## ", 1)[0]
    names = {}
    for line in section.splitlines():
        if line.startswith("- `optimus_preflight") and "`: `" in line:
            module, rest = line[3:].split("`: ", 1)
            names[module] = [part.strip().strip("`") for part in rest.split(",")]
    return names


def test_the_architecture_doc_lists_exactly_the_public_names():
    documented = _documented_public_names()
    assert documented, "docs/ARCHITECTURE.md has no Public API list"
    for module, names in documented.items():
        assert PUBLIC.get(module) == names, module
        imported = importlib.import_module(module)
        assert all(hasattr(imported, name) for name in names), module
