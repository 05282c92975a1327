"""trainer.micro_batch_size through the CLI: auto picks the largest micro-batch the memory
verdict's own trace fits (with the verdict's 10% headroom) that divides the batch of one
optimizer step, which stays what the config asks; a fixed size trains exactly what the
full batch trains; a value that cannot split the batch is a user error naming the key."""

from __future__ import annotations

import json
import re

import pytest

from optimus_preflight import compose
from optimus_preflight.config.validate import validate_config
from optimus_preflight.errors import UserError
from optimus_preflight.memory.cuda_rules import CUDA_CONTEXT_BYTES
from optimus_preflight.preflight.analyses.memory_limit import NEAR_LIMIT
from optimus_preflight.preflight.analyses.micro_batch import memory_need
from optimus_preflight.preflight.analyses.step_inputs import step_inputs
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import run_cli, tiny_config

GIB = 1 << 30
TINY = ("recipe=char_lm_tiny", "logging.progress=none")
# 48 x 2 = 96 samples per optimizer step; long sequences so activations dominate the need.
JOB = ("data.batch_size=48", "trainer.accumulation_steps=2", "data.train.block_size=256",
       "preflight.memory.usable_fraction=1.0", "preflight.memory.reserve_gib=0.0")
BATCH = 96
CHOICE = re.compile(r"trainer\.micro_batch_size=auto: micro-batch (\d+) x (\d+) accumulation steps")


def test_auto_picks_the_largest_divisor_that_fits_and_keeps_the_batch(tmp_path):
    """The limit is set between the traced needs of 40 and 41 samples: 40 is the largest
    that fits, 96 is not divisible by it, so the run trains on 32 x 3."""
    recipe = CharLMRecipe(tiny_config(*JOB, "preflight.memory.target_gib=80"), run_dir=tmp_path / "trace")
    recipe.setup()
    try:
        ctx = PreflightContext.from_recipe(recipe)
        _, memory, need = memory_need(ctx, step_inputs(ctx), BATCH)
        headroom = (need(40) + need(41)) // 2
        target_gib = (headroom / NEAR_LIMIT + CUDA_CONTEXT_BYTES) / GIB
        result = run_cli(tmp_path / "run", *TINY, *JOB, "trainer.micro_batch_size=auto",
                         f"preflight.memory.target_gib={target_gib!r}", "trainer.max_steps=2")
        assert result.returncode == 0, result.output
        micro, accumulation = map(int, CHOICE.search(result.output).groups())
        assert (micro, accumulation) == (32, 3) and memory == "GPU"
        line = next(line for line in result.output.splitlines() if CHOICE.search(line))
        assert "the 96 samples per optimizer step the config asks" in line
        assert "40 would fit, but 96 is not divisible by it: 32 is its largest divisor that fits" in line
        # By the same trace: the chosen size fits the headroom, and so does 40, but not 41.
        limit = int((target_gib * GIB) - CUDA_CONTEXT_BYTES)
        assert need(32) <= need(40) <= NEAR_LIMIT * limit < need(41)
        assert f"predicted peak {need(32) / 2**20:.1f} MiB" in line
    finally:
        recipe.close()
    # The preflight's verdict on the run as split: it fits, quietly (within the headroom).
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    vram = next(check for check in report["checks"] if check["name"] == "memory.vram_headroom")
    assert vram["status"] == "passed" and not vram["issues"]
    assert vram["data"]["need_bytes"] <= NEAR_LIMIT * vram["data"]["limit_bytes"]
    assert result.summary()["status"] == "completed"


def test_a_fixed_micro_batch_trains_what_the_full_batch_trains(tmp_path):
    steps = ("trainer.max_steps=6", "trainer.eval_every_n_steps=3")
    full = run_cli(tmp_path / "full", *TINY, *steps, "data.batch_size=24")
    split = run_cli(tmp_path / "split", *TINY, *steps, "data.batch_size=24", "trainer.micro_batch_size=6")
    assert full.returncode == 0 and split.returncode == 0, full.output + split.output
    assert "micro-batch 6 x 4 accumulation steps = the 24 samples per optimizer step" in split.output

    def losses(result):
        records = result.metrics()
        return [r["loss"] for r in records if "loss" in r], [r["val_loss"] for r in records if "val_loss" in r]

    (full_losses, full_val), (split_losses, split_val) = losses(full), losses(split)
    assert len(full_losses) == 6 and split_losses == pytest.approx(full_losses, abs=1e-5)
    assert split_val == pytest.approx(full_val, abs=1e-5)  # evaluation kept data.batch_size's batches


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused_naming_the_key(tmp_path):
    result = run_cli(tmp_path / "run", *TINY, "data.batch_size=16", "trainer.accumulation_steps=3",
                     "trainer.micro_batch_size=5")
    assert result.returncode == 2, result.output
    assert "trainer.micro_batch_size=5 does not divide the 48 samples" in result.output
    assert "1, 2, 3, 4, 6, 8, 12, 16, 24, 48" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "big", "true"])
def test_micro_batch_size_must_be_a_positive_integer_or_auto(value):
    with pytest.raises(UserError) as raised:
        validate_config(compose([*TINY, f"trainer.micro_batch_size={value}"]))
    assert raised.value.key == "trainer.micro_batch_size" and "trainer.micro_batch_size=auto" in raised.value.fix
    for ok in ("auto", "4", "null"):
        validate_config(compose([*TINY, f"trainer.micro_batch_size={ok}"]))


def test_auto_on_a_cpu_job_fits_host_ram(tmp_path, monkeypatch):
    """Without a GPU to judge, the verdict (memory.host_ram) and so auto use host RAM:
    with RAM for 20 samples of 48 and none more, the run trains on 16 x 3."""
    from collections import namedtuple

    from optimus_preflight.preflight.analyses import micro_batch as micro_batch_module
    from optimus_preflight.preflight.analyses.memory_limit import host_memory_held

    host = ("data.batch_size=48", "data.train.block_size=256", "preflight.memory.reserve_gib=0.0")
    probe = CharLMRecipe(tiny_config(*host), run_dir=tmp_path / "probe")
    probe.setup()
    try:
        ctx = PreflightContext.from_recipe(probe)
        _, memory, need = memory_need(ctx, step_inputs(ctx), 48)
        held = host_memory_held(ctx)
        headroom = (need(20) + need(21)) // 2
    finally:
        probe.close()
    assert memory == "host" and need(20) < need(21)
    available = int(headroom / NEAR_LIMIT) - held
    memory_state = namedtuple("VirtualMemory", "available total")(available, 2 * available)
    monkeypatch.setattr(micro_batch_module.psutil, "virtual_memory", lambda: memory_state)
    recipe = CharLMRecipe(tiny_config(*host, "trainer.micro_batch_size=auto"), run_dir=tmp_path / "run")
    recipe.setup()
    try:
        assert (recipe.cfg.data.batch_size, recipe.cfg.trainer.accumulation_steps) == (16, 3)
        assert recipe.batches.accumulation_steps == 3 and recipe.train_loader.batch_size == 16
        assert recipe.val_loader.batch_size == 48  # evaluation keeps the configured batch
    finally:
        recipe.close()


def test_a_recipe_whose_loader_ignores_data_batch_size_is_refused(tmp_path):
    """Accumulating 4 batches that are not micro-batches would train 4x the batch: refused."""
    from torch.utils.data import DataLoader

    class FixedBatchRecipe(CharLMRecipe):
        def build_dataloaders(self):
            train, val = super().build_dataloaders()
            return DataLoader(train.dataset, batch_size=16), val

    recipe = FixedBatchRecipe(tiny_config("data.batch_size=16", "trainer.micro_batch_size=4"), run_dir=tmp_path / "run")
    with pytest.raises(UserError) as raised:
        recipe.setup()
    recipe.close()
    assert raised.value.key == "trainer.micro_batch_size" and "batch_size=16" in raised.value.message
