"""Callbacks (optimus_preflight.callbacks): from the config and from code, every event in
order, their state carried across an interrupt, and nothing asked of a recipe without them."""

from __future__ import annotations

import json

import pytest

from optimus_preflight.callbacks import Callback, CallbackList
from optimus_preflight.errors import UserError
from tests.callback_examples import EventLog, WeightEMA
from tests.conftest import run_cli
from tests.shapes_cnn_recipe import ShapesCNN

SHAPES = ("recipe._target_=tests.shapes_cnn_recipe.ShapesCNN", "logging.progress=none", "preflight.enabled=false",
          "trainer.max_epochs=1")


def test_events_nobody_overrides_have_no_listeners_and_state_goes_by_place_and_class():
    events = CallbackList([EventLog(), WeightEMA()])
    assert events.listens("on_step_end") and events.listens("before_optimizer_step")
    assert not CallbackList([WeightEMA()]).listens("before_optimizer_step")
    assert CallbackList([Callback()]).listeners["on_step_end"] == []
    ema = WeightEMA()
    ema.updates = 7
    saved = CallbackList([EventLog(), ema]).state_dict()
    assert list(saved) == ["WeightEMA:0"]
    fresh = WeightEMA()
    CallbackList([EventLog(), fresh]).load_state_dict(saved)
    assert fresh.updates == 7
    with pytest.raises(UserError, match="handles none of the events"):
        CallbackList([object()])


def test_every_event_in_order_from_code(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENT_LOG", str(tmp_path / "events.jsonl"))
    cfg = ShapesCNN.compose(["logging.progress=none", "preflight.enabled=false", "trainer.max_steps=4",
                             "trainer.eval_every_n_steps=2", "checkpoint.every_n_steps=4"])
    ShapesCNN(cfg, run_dir=tmp_path / "run", callbacks=[EventLog()]).run()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0] == ["fit_start", 0]
    assert events[1:4] == [["step_start", 1], ["before_optimizer_step", 1, True], ["step_start", 2]]
    assert ["eval_end", 2, ["val_acc", "val_loss"]] in events and ["eval_end", 4, ["test_acc", "test_loss"]] in events
    assert ["checkpoint", "step_00000004"] in events and events[-1] == ["fit_end", 4]


@pytest.mark.slow
def test_a_callback_from_the_config_keeps_its_state_across_ctrl_c(tmp_path):
    ema = "callbacks=[{_target_:tests.callback_examples.WeightEMA,decay:0.8}]"
    whole = run_cli(tmp_path / "whole", *SHAPES, ema)
    assert whole.returncode == 0, whole.output
    stopped = run_cli(tmp_path / "cut", *SHAPES, ema, env={"SHAPES_SIGNAL_AT": "9"})
    assert stopped.returncode == 130, stopped.output
    resumed = run_cli(tmp_path / "cut", *SHAPES, ema)
    assert resumed.returncode == 0, resumed.output
    assert resumed.summary()["ema"] == whole.summary()["ema"]  # bit-exact: the shadow weights were saved
    assert whole.summary()["ema"]["updates"] == 16
    wrong = run_cli(tmp_path / "wrong", *SHAPES, "callbacks=[{_target_:collections.OrderedDict}]")
    assert wrong.returncode == 2 and "callbacks" in wrong.output and "Traceback" not in wrong.output
