"""Every number of the config has a range in its schema, checked before any work; an
interpolation or override that does not parse names itself (issue 29, part A)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from optimus_preflight import compose
from optimus_preflight.config import schema
from optimus_preflight.config.registration import register_configs
from optimus_preflight.config.schema import RANGE
from optimus_preflight.errors import UserError
from tests.conftest import run_cli, tiny_config


def _stored_dataclasses() -> set[type]:
    """The dataclass of every node in Hydra's ConfigStore: the toolkit's schemas and those
    the installed recipes register (the shipped char-LM's model and data)."""
    register_configs()
    found: set[type] = set()

    def walk(tree: dict) -> None:
        for value in tree.values():
            if isinstance(value, dict):
                walk(value)
            elif getattr(value, "node", None) is not None:
                kind = OmegaConf.get_type(value.node)
                # Hydra's own plugins (launchers, sweepers) store theirs too: not this config's.
                if dataclasses.is_dataclass(kind) and kind.__module__.startswith("optimus_preflight."):
                    found.add(kind)

    walk(ConfigStore.instance().repo)
    return found


def _all_schema_dataclasses() -> set[type]:
    own = {kind for _, kind in inspect.getmembers(schema, inspect.isclass)
           if dataclasses.is_dataclass(kind) and kind.__module__ == schema.__name__ and kind is not schema.Range}
    return own | _stored_dataclasses()


def _is_numeric(hint: object) -> bool:
    if hint in (int, float):
        return True
    return any(_is_numeric(arg) for arg in typing.get_args(hint) if arg is not type(None))


def test_every_numeric_field_of_every_schema_has_a_range():
    kinds = _all_schema_dataclasses()
    assert schema.TrainerConfig in kinds and any(k.__name__ == "StdlibCharWindowsConfig" for k in kinds)
    missing = []
    for kind in kinds:
        hints = typing.get_type_hints(kind)
        for spec in dataclasses.fields(kind):
            if _is_numeric(hints[spec.name]) and hints[spec.name] is not bool and RANGE not in spec.metadata:
                missing.append(f"{kind.__qualname__}.{spec.name}")
    assert not missing, f"numeric fields without a range (declare them with schema.ranged): {missing}"


def test_every_default_is_inside_its_own_range():
    tiny_config()  # the shipped defaults and the tiny preset pass
    for kind in _all_schema_dataclasses():
        for spec in dataclasses.fields(kind):
            rng = spec.metadata.get(RANGE)
            values = spec.default if isinstance(spec.default, tuple) else (spec.default,)
            for value in values:
                if rng is not None and value is not None:
                    assert value in rng, f"{kind.__qualname__}.{spec.name}={value}"


@pytest.mark.parametrize(("override", "message"), [
    ("scheduler.warmup_steps=-3", "scheduler.warmup_steps must be >= 0, got -3"),
    ("scheduler.min_lr_ratio=2", "scheduler.min_lr_ratio must be <= 1"),
    ("data.train.val_fraction=1.5", "data.train.val_fraction must be < 1, got 1.5"),
    ("data.train.max_chars=0", "data.train.max_chars must be >= 2, got 0"),
    ("trainer.seed=99999999999999999999999", "trainer.seed must be <= "),
    ("preflight.first_batch_timeout_s=1e300", "preflight.first_batch_timeout_s must be <= 100000000"),
    ("preflight.first_batch_timeout_s=nan", "must be a number, not nan"),
    ("optimizer.betas=[0.9,1.5]", "optimizer.betas must be < 1"),
    ("trainer.max_steps=0", "trainer.max_steps must be >= 1 or null"),
    ("checkpoint.extra_signal=SIGKILL", "checkpoint.extra_signal must be one of SIGUSR1"),
    ("checkpoint.extra_signal=SIGSEGV", "SIGUSR2"),
])
def test_a_value_out_of_its_range_is_a_user_error_naming_the_key_and_a_good_value(override, message):
    key = override.split("=")[0]
    with pytest.raises(UserError, match=".*") as caught:
        tiny_config(override)
    text = str(caught.value)
    assert message in text, text
    assert f"Set {key}=" in text


@pytest.mark.parametrize("override", ["trainer.max_steps=${nope.x}", "trainer.max_steps=${optimizer.lr}"])
def test_an_interpolation_that_does_not_resolve_names_its_key(override):
    with pytest.raises(UserError) as caught:
        compose(["recipe=char_lm_tiny", override])
    assert override in str(caught.value)


@pytest.mark.slow
def test_the_cli_refuses_a_bad_value_before_touching_an_existing_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(run_dir, "recipe=char_lm_tiny", "preflight.enabled=false", "trainer.max_steps=2",
                    "logging.progress=none")
    assert first.returncode == 0, first.output
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    for override in ("scheduler.warmup_steps=-3", "data.train.val_fraction=1.5", "trainer.seed=99999999999999999999999",
                     "checkpoint.extra_signal=SIGKILL", "preflight.first_batch_timeout_s=1e300",
                     "trainer.max_steps=${nope.x}", "optimizer.betas=[0.9,0.95", "=5"):
        result = run_cli(run_dir, "recipe=char_lm_tiny", "trainer.max_steps=2", override)
        assert result.returncode == 2, (override, result.output)
        assert "Traceback" not in result.output, override
        assert override in result.stderr or f"{override.split('=')[0]} must be" in result.stderr, result.stderr
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


@pytest.mark.parametrize("override, fix", [
    ("optimizer.betas=[0.9,0.95", "Close the list with ']' (optimizer.betas=[0.9,0.95])"),
    ("trainer.max_steps=${trainer.seed", "Close the brace with '}'"),
    ("=5", "Write it as key=value"),
])
def test_a_syntax_error_names_the_override_and_the_fix(override, fix):
    from optimus_preflight.app import check_override_syntax

    with pytest.raises(UserError) as caught:
        check_override_syntax(["trainer.max_steps=5", override])
    assert repr(override) in str(caught.value) and fix in str(caught.value)
