"""Logging adds no host-device synchronisation on steps that are not logged.

On CPU there is no device to wait for, so the test counts the calls that would be a
sync on a GPU: reading a tensor's value into Python (.item(), bool(), float(), int(),
.tolist()) from the toolkit's or the recipe's code. Reads inside torch itself are not
counted (AdamW reads its CPU-side step counters, which is no device sync). The only read
allowed per step is the non-finite check that decides whether to apply the optimizer
step, as GradScaler's own check is.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config

READS = ("item", "__bool__", "__float__", "__int__", "tolist")


@contextlib.contextmanager
def count_tensor_reads(counter: list[int]):
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    torch_dir = str(Path(torch.__file__).parent)

    def wrap(original):
        def counted(self, *args, **kwargs):
            if not sys._getframe(1).f_code.co_filename.startswith(torch_dir):
                counter[0] += 1
            return original(self, *args, **kwargs)

        return counted

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


class MetricLoggingCharLM(CharLMRecipe):
    """Logs a metric of its own every micro-batch, as a user recipe does."""

    def compute_loss(self, model, batch):
        loss, count = super().compute_loss(model, batch)
        self.log("perplexity", loss.detach().exp(), prog_bar=True)
        return loss, count


def _reads_for(steps: int, tmp_path, precision: str, skip_nonfinite: bool, recipe_class: type = CharLMRecipe) -> int:
    cfg = tiny_config(
        f"trainer.max_steps={steps}",
        "logging.every_n_steps=1000",  # only the forced last step is logged
        "data.val=null",
        "checkpoint.every_n_steps=0",
        "preflight.enabled=false",
        f"trainer.precision={precision}",
        f"trainer.skip_nonfinite={str(skip_nonfinite).lower()}",
        "trainer.accumulation_steps=2",
    )
    recipe = recipe_class(cfg, run_dir=tmp_path / f"run{steps}")
    recipe.setup()
    counter = [0]
    with count_tensor_reads(counter):
        recipe.train()
    return counter[0]


@pytest.mark.parametrize(
    "precision, skip_nonfinite, per_step",
    [("fp32", True, 1), ("bf16", True, 1), ("fp32", False, 0)],
)
def test_unlogged_steps_read_nothing_but_the_nonfinite_check(tmp_path, precision, skip_nonfinite, per_step):
    # Fixed costs (the last, logged step; the final checkpoint) cancel in the difference.
    extra_reads = _reads_for(10, tmp_path, precision, skip_nonfinite) - _reads_for(4, tmp_path, precision, skip_nonfinite)
    assert extra_reads == 6 * per_step


def test_a_metric_the_recipe_logs_is_read_on_logged_steps_only(tmp_path):
    extra_reads = (_reads_for(10, tmp_path, "fp32", True, MetricLoggingCharLM)
                   - _reads_for(4, tmp_path, "fp32", True, MetricLoggingCharLM))
    assert extra_reads == 6  # the non-finite check alone, as without the metric
    records = [line for line in (tmp_path / "run10" / "metrics.jsonl").read_text().splitlines() if "perplexity" in line]
    assert len(records) == 2  # step 1 (always logged) and the forced last step
