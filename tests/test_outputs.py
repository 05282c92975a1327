"""Run outputs: TensorBoard scalars, progress display choice, params hash."""

from __future__ import annotations

import json

import pytest
import torch
from optimus_preflight.recipes.char_lm import CharLMRecipe
from torch import nn

from optimus_preflight.progress import use_bar
from optimus_preflight.summary import params_sha256
from tests.conftest import tiny_config


def test_tensorboard_scalars_are_written_when_enabled(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard (the [tensorboard] extra) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config("trainer.max_steps=4", "logging.tensorboard=true", "preflight.enabled=false")
    CharLMRecipe(cfg, run_dir=tmp_path).run()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"loss", "lr", "grad_norm", "val_loss"} <= set(events.Tags()["scalars"])
    logged = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "loss" in line and "val_loss" not in line]
    assert [e.value for e in events.Scalars("loss")] == pytest.approx(logged)


def test_progress_bar_only_on_a_terminal(monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not use_bar("auto") and use_bar("bar") and not use_bar("lines")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert use_bar("auto")


def test_params_hash_depends_on_weights_only():
    torch.manual_seed(0)
    a = nn.Linear(3, 2)
    b = nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert params_sha256(a) == params_sha256(b)
    with torch.no_grad():
        b.bias[0] += 1e-7
    assert params_sha256(a) != params_sha256(b)
