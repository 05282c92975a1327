"""The accumulation check runs in the memory-tight case, and a fix names what works in
the recipe it fires in (a config key, or the code change when a builder is overridden)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from optimus_preflight.preflight.checks.model_checks import WeightDecayCheck
from optimus_preflight.preflight.checks.step_runs import AccumulationCheck
from tests.preflight_support import assert_quiet, codes, make_recipe, run


def _summed(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="sum")


@pytest.mark.parametrize(("batch_size", "micro_batches"), [(2, 4), (3, 8), (1, 4)])
@pytest.mark.parametrize(("loss", "fires"), [(None, False), (_summed, True)])
def test_accumulation_is_verified_when_the_micro_batch_is_smaller_than_the_window(tmp_path, batch_size, micro_batches, loss, fires):
    recipe = make_recipe(tmp_path, f"data.batch_size={batch_size}", f"trainer.accumulation_steps={micro_batches}", loss=loss)
    result = run(recipe, AccumulationCheck)["step.accumulation"]
    # Never more samples than one micro-batch (at least two): the reference batch fits where training fits.
    assert result.data["samples"] == max(batch_size, 2)
    if fires:
        assert codes(result) == {"O9"}
    else:
        assert_quiet(result)
        assert result.data["norm_ratio"] == pytest.approx(1.0, abs=1e-4)


def _adam_with_decay_everywhere(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.1)


def test_weight_decay_fixes_name_the_code_change_when_build_optimizer_is_overridden(tmp_path):
    result = run(make_recipe(tmp_path, optimizer=_adam_with_decay_everywhere), WeightDecayCheck)["model.weight_decay"]
    assert codes(result) == {"O6"} and len(result.issues) == 2
    for issue in result.issues:
        assert "optimizer." not in issue.fix.split("optimus_preflight.training.optim")[0]  # no config key that does nothing here
        assert issue.config_key is None and "build_optimizer" in issue.fix


def test_weight_decay_fix_names_the_config_key_for_the_default_builder(tmp_path):
    result = run(make_recipe(tmp_path, "optimizer.decay_bias_and_norm=true"), WeightDecayCheck)["model.weight_decay"]
    assert codes(result) == {"O6"}
    (issue,) = result.issues
    assert issue.config_key == "optimizer.decay_bias_and_norm" and "optimizer.decay_bias_and_norm=false" in issue.fix
    assert_quiet(run(make_recipe(tmp_path), WeightDecayCheck)["model.weight_decay"])
