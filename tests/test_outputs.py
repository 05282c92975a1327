"""Run outputs: TensorBoard scalars, progress display choice, params hash."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.reporting.progress import use_bar
from optimus_preflight.reporting.summary import params_sha256
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


class _NonFiniteLoss(CharLMRecipe):
    """The loss turns NaN from step 6 on (the steps are skipped, and logged as such)."""

    def compute_loss(self, model, batch):
        loss, count = super().compute_loss(model, batch)
        if self.preflight_report is not None and model.training and self.state.step >= 5:
            loss = loss * float("nan")
        return loss, count


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_outputs_never_hold_bare_nan_and_say_which_values_were_not_finite(tmp_path):
    summary = _NonFiniteLoss(tiny_config("trainer.max_steps=8", "trainer.eval_every_n_steps=0"), run_dir=tmp_path).run()
    assert summary["status"] == "completed" and summary["skipped_steps"] == 3
    written = _strict_json((tmp_path / "summary.json").read_text())
    assert written["final_loss"] is None and written["nonfinite"] == {"final_loss": "nan"}
    records = [_strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "loss" in r][-1]
    assert last["step"] == 8 and last["loss"] is None and last["nonfinite"]["loss"] == "nan"
    _strict_json((tmp_path / "preflight.json").read_text())

    from optimus_preflight.plotting.runs import load_run

    steps, losses = load_run(tmp_path).series("loss")  # the plots still see the NaN
    assert steps[-1] == 8 and losses[-1] != losses[-1]
