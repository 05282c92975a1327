"""The parts behind a user's own recipe, tested alone: declared config, read tracking,
run length, metric collection and evaluation, monitors, warmup fitting, the best link."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight import compose
from optimus_preflight.checkpoint.store import CheckpointStore
from optimus_preflight.config.reads import UnreadOverride, check_overrides_read, override_keys, recording_reads
from optimus_preflight.errors import UserError
from optimus_preflight.preflight.checks.config_checks import peak_not_reached
from optimus_preflight.training.evaluation import evaluate_metrics, step_metrics
from optimus_preflight.training.monitoring import MetricMonitor
from optimus_preflight.training.optim import fitted_warmup
from optimus_preflight.training.precision import PrecisionPlan
from optimus_preflight.training.run_length import optimizer_steps_per_epoch, planned_max_steps
from optimus_preflight.training.user_metrics import MetricCollector, prefixed
from tests.tabular_recipe import Broken, TabularMLP, UnknownGroup

CPU_FP32 = PrecisionPlan("fp32", torch.device("cpu"))


# ------------------------------------------------------------ declared config
def test_declared_defaults_land_in_their_groups_and_the_command_line_wins():
    cfg = TabularMLP.compose(["model.layers=3"])
    assert OmegaConf.to_container(cfg.model) == {"hidden": 32, "layers": 3}
    assert cfg.trainer.max_steps == 20 and cfg.checkpoint.keep_last == 1
    assert cfg.scheduler.warmup_fraction == 0.1 and cfg.scheduler._target_.endswith("warmup_cosine")
    # The recipe's scheduler values belong to its option: another option does not inherit them.
    assert "warmup_fraction" not in TabularMLP.compose(["scheduler=constant"]).scheduler
    with pytest.raises(UserError, match="model.hiden"):
        TabularMLP.compose(["model.hiden=3"])


def test_a_bad_declaration_names_the_attribute():
    with pytest.raises(UserError, match="model_config must be a dataclass"):
        Broken.compose([])

    with pytest.raises(UserError, match="unknown group 'trainr'"):
        UnknownGroup.compose([])


# -------------------------------------------------------------- read tracking
def test_reads_are_recorded_by_key_whole_nodes_and_interpolations():
    cfg = compose(["recipe=char_lm_tiny"])
    with recording_reads(cfg) as reads:
        _ = cfg.data.batch_size
        _ = cfg.model.block_size  # ${data.train.block_size}
        OmegaConf.to_container(cfg.optimizer)
        _ = OmegaConf.create({"other": 1}).other  # another config: not this run's reads
    assert reads.covers("data.batch_size") and not reads.covers("data.num_workers")
    assert reads.covers("data.train.block_size") and reads.covers("optimizer.lr")
    assert not reads.covers("model.n_layer") and "other" not in reads.values


def test_an_override_nobody_reads_names_the_key_and_what_is_read():
    cfg = TabularMLP.compose([])
    with recording_reads(cfg) as reads:
        TabularMLP.build_model(type("Host", (), {"cfg": cfg})())
    with pytest.raises(UnreadOverride) as error:
        check_overrides_read(["model.layers=4", "trainer.max_steps=5"], reads, TabularMLP)
    message = str(error.value)
    assert "model.layers is set, but TabularMLP.build_model does not read cfg.model.layers" in message
    assert "it reads model.hidden" in message
    check_overrides_read(["model.hidden=4", "optimizer=sgd", "+trainer.x=1"], reads, TabularMLP)  # read, a choice, toolkit's
    assert override_keys(["a=1", "b.c=2", "~d.e", "+f.g=3", "hydra.run.dir=x"]) == ["b.c", "f.g"]


# ----------------------------------------------------------------- run length
def test_the_run_length_from_steps_epochs_or_both():
    loader = DataLoader(TensorDataset(torch.zeros(10, 1)), batch_size=3)  # 4 batches
    assert optimizer_steps_per_epoch(loader, 1) == 4 and optimizer_steps_per_epoch(loader, 3) == 2  # short last window
    assert planned_max_steps(7, None, 4) == 7
    assert planned_max_steps(None, 3, 4) == 12 and planned_max_steps(5, 3, 4) == 5
    with pytest.raises(UserError, match="trainer.max_epochs"):
        planned_max_steps(100, 2, None)
    with pytest.raises(UserError, match="neither"):
        planned_max_steps(None, None, 4)
    with pytest.raises(UserError, match="neither trainer.max_steps nor trainer.max_epochs"):
        TabularMLP.compose(["trainer.max_steps=null"])


# ---------------------------------------------------------- metric collection
def test_metrics_are_ignored_outside_a_step_and_averaged_inside():
    collector = MetricCollector()
    collector.log("acc", 0.5)  # the preflight calls compute_loss too
    collector.start_step()
    collector.log("acc", torch.tensor(0.25))
    collector.log("acc", 0.75, prog_bar=True)
    collector.end_step()
    assert collector.step_values() == {"acc": 0.5} and collector.progress_bar == {"acc"}
    with pytest.raises(ValueError, match="one-element tensor"):
        collector.start_step()
        collector.log("acc", torch.ones(3))


def test_evaluation_weighs_every_metric_by_batch_size_or_the_returned_count():
    features = torch.arange(10, dtype=torch.float32).unsqueeze(1)
    loader = DataLoader(TensorDataset(features), batch_size=4)  # batches of 4, 4, 2

    def step(model, batch):
        (x,) = batch
        return {"mean": x.mean(), "counted": (x.sum() / 2, 2)[0]}

    metrics = evaluate_metrics(nn.Identity(), loader, step, CPU_FP32, MetricCollector())
    assert metrics["mean"] == pytest.approx(4.5)  # the mean over all ten samples, not of the batch means
    assert step_metrics(torch.tensor(1.0), (torch.zeros(3),)) == ({"loss": torch.tensor(1.0)}, 3)
    assert step_metrics(({"a": 1.0}, 7), None)[1] == 7
    with pytest.raises(UserError, match="validation_step returned str"):
        step_metrics("oops", None)
    assert prefixed({"acc": 1.0, "val_loss": 2.0}, "val_") == {"val_acc": 1.0, "val_loss": 2.0}
    empty = evaluate_metrics(nn.Identity(), DataLoader(TensorDataset(torch.zeros(0, 1))), step, CPU_FP32, MetricCollector())
    assert empty == {}


# ------------------------------------------------------------------- monitors
def test_a_monitor_tracks_the_best_in_its_direction_and_survives_a_resume():
    monitor = MetricMonitor("val_acc", "max", min_delta=0.01)
    assert monitor.update({"val_acc": 0.5}, 10) and not monitor.update({"val_acc": 0.505}, 20)
    assert monitor.update({"val_acc": 0.6}, 30) and not monitor.update({"val_acc": math.nan}, 40)
    assert (monitor.best, monitor.best_step, monitor.evals_without_improvement) == (0.6, 30, 1)
    restored = MetricMonitor("val_acc", "max", min_delta=0.01)
    restored.load_state_dict(monitor.state_dict())
    assert restored == monitor
    other = MetricMonitor("val_loss")
    other.load_state_dict(monitor.state_dict())  # another metric: its history does not apply
    assert other.best is None


# ------------------------------------------------------------------ schedules
def test_a_warmup_as_long_as_the_run_is_fitted_and_the_check_says_so(caplog):
    assert fitted_warmup(40, None, 400) == 40 and fitted_warmup(40, 0.05, 400) == 20
    assert fitted_warmup(40, None, 30) == 3 and "never reach" in caplog.text
    unreached = peak_not_reached([(0, 0.1), (9, 0.25)], base=1.0, max_steps=10)
    assert unreached is not None and "peaks at 2.50e-01 (25%)" in unreached
    assert peak_not_reached([(0, 0.1), (9, 1.0)], base=1.0, max_steps=10) is None


# ------------------------------------------------------------- best checkpoint
def test_the_best_checkpoint_is_a_linked_copy_that_retention_never_prunes(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    first = store.save({"model": {"w": torch.ones(2)}, "run_state": {"step": 1}}, step=1)
    best = store.keep_as_best(first)
    second = store.save({"model": {"w": torch.zeros(2)}, "run_state": {"step": 2}}, step=2)
    store.wait_for_deletions()
    assert not first.exists() and second.exists()  # keep_last=1 pruned step 1 ...
    assert torch.equal(store.load(best)["model"]["w"], torch.ones(2))  # ... but not its best copy
    store.keep_as_best(second)
    assert torch.equal(store.load(best)["model"]["w"], torch.zeros(2))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["best", "latest", "step_00000002"]


@pytest.mark.slow
def test_ranks_with_different_metrics_or_no_eval_batch_reduce_together(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "tests/ranks_metrics.py"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RESULTS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["eval"] for r in results] == [{"acc": 0.5}, {"acc": 0.5}]  # rank 1 joined with weight 0
    assert all(r["step"] == {"only_on_this_rank": 4.0, "shared": 2.0} for r in results)  # over the ranks that logged it
