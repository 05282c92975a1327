"""Callbacks as users write them, for the tests: one with state (an EMA of the weights)
and one that records the events it sees."""

from __future__ import annotations

import json
import os

import torch

from optimus_preflight.callbacks import Callback


class WeightEMA(Callback):
    """An exponential moving average of the model's weights, kept across a resume."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.shadow: dict[str, torch.Tensor] = {}
        self.updates = 0

    def on_step_end(self, recipe, step, record):
        with torch.no_grad():
            for name, param in recipe.model.named_parameters():
                previous = self.shadow.get(name)
                self.shadow[name] = param.detach().clone() if previous is None else previous.mul(self.decay).add(param.detach(), alpha=1 - self.decay)
        self.updates += 1

    def on_fit_end(self, recipe, summary):
        digest = float(sum(t.double().sum() for t in self.shadow.values()))
        summary["ema"] = {"updates": self.updates, "digest": digest}

    def state_dict(self):
        return {"updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state):
        self.updates, self.shadow = state["updates"], dict(state["shadow"])


class EventLog(Callback):
    """Appends each event to the JSON-lines file EVENT_LOG names."""

    def _write(self, *event):
        with open(os.environ["EVENT_LOG"], "a") as handle:
            handle.write(json.dumps(event) + "\n")

    def on_fit_start(self, recipe):
        self._write("fit_start", recipe.state.step)

    def on_step_start(self, recipe, step):
        self._write("step_start", step)

    def before_optimizer_step(self, recipe, step):
        grads = all(p.grad is not None for p in recipe.model.parameters() if p.requires_grad)
        self._write("before_optimizer_step", step, grads)

    def on_eval_end(self, recipe, step, metrics):
        self._write("eval_end", step, sorted(metrics))

    def on_checkpoint(self, recipe, path):
        self._write("checkpoint", str(path).rsplit("/", 1)[-1])

    def on_fit_end(self, recipe, summary):
        self._write("fit_end", summary["steps"])

    def on_exception(self, recipe, error):
        self._write("exception", type(error).__name__)
