"""Callbacks: code that runs at the training loop's events without overriding the loop
(an EMA of the weights, a custom logger, a profiler window).

Subclass ``Callback`` and override the events you need; each receives the recipe (its
``model``, ``optimizer``, ``state.step``, ``cfg`` ...). Give them to a run from the config,
``callbacks: [{_target_: my_module.MyCallback, ...}]`` (``+callbacks=[...]`` on the command
line), or in code, ``MyRecipe(cfg, callbacks=[MyCallback()])``.

A callback with state returns it from ``state_dict()``: it is saved in every checkpoint
and handed back to ``load_state_dict()`` on resume, so a resumed run continues it.
Events nobody overrides cost nothing per step.
"""

from __future__ import annotations

from typing import Any

from optimus_preflight.errors import UserError

EVENTS = ("on_fit_start", "on_step_start", "before_optimizer_step", "on_step_record", "on_step_end", "on_eval_end",
          "on_checkpoint", "on_fit_end", "on_exception", "wants_step_logged")


class Callback:
    def on_fit_start(self, recipe: Any) -> None:
        """Before the first step of this process (after the preflight and a resume)."""

    def on_step_start(self, recipe: Any, step: int) -> None:
        """Before optimizer step ``step`` (1-based) reads its batches."""

    def before_optimizer_step(self, recipe: Any, step: int) -> None:
        """After the window's backward (gradients unscaled and clipped), before ``optimizer.step()``."""

    def wants_step_logged(self, recipe: Any, step: int) -> bool:
        """Whether step ``step`` must be logged for this callback (its record built) even
        when ``logging.every_n_steps`` would skip it. Called after every step: keep it cheap."""
        return False

    def on_step_record(self, recipe: Any, step: int, result: Any, record: dict[str, Any]) -> None:
        """On a logged step, before the record reaches the sinks and the progress line: add
        your keys to ``record``. ``result``: the step's ``StepResult`` (tensors on the device)."""

    def on_step_end(self, recipe: Any, step: int, record: dict[str, Any] | None) -> None:
        """After optimizer step ``step``; ``record``: its metrics on a logged step, else None."""

    def on_eval_end(self, recipe: Any, step: int, metrics: dict[str, float]) -> None:
        """After an evaluation (``val_*``) or the test (``test_*``)."""

    def on_checkpoint(self, recipe: Any, path: Any) -> None:
        """After a periodic, best or final checkpoint was saved at ``path``."""

    def on_fit_end(self, recipe: Any, summary: dict[str, Any]) -> None:
        """After training and the test, with the summary about to be written."""

    def on_exception(self, recipe: Any, error: BaseException) -> None:
        """Training ended with ``error`` (an interrupt included); the error propagates."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _overrides(callback: Any, event: str) -> bool:
    method = getattr(type(callback), event, None)
    return method is not None and method is not getattr(Callback, event)


class CallbackList:
    """Dispatches each event to the callbacks that override it."""

    def __init__(self, callbacks: list[Any]):
        for callback in callbacks:
            if not any(hasattr(callback, event) for event in EVENTS):
                raise UserError(f"callback {type(callback).__qualname__} handles none of the events {', '.join(EVENTS)}",
                                key="callbacks", fix="Subclass optimus_preflight.callbacks.Callback and override the events you need.")
        self.callbacks = list(callbacks)
        self.listeners = {event: [c for c in self.callbacks if _overrides(c, event)] for event in EVENTS}

    def listens(self, event: str) -> bool:
        return bool(self.listeners[event])

    def fire(self, event: str, recipe: Any, *args: Any) -> None:
        for callback in self.listeners[event]:
            getattr(callback, event)(recipe, *args)

    def any_wants_step_logged(self, recipe: Any, step: int) -> bool:
        return any(callback.wants_step_logged(recipe, step) for callback in self.listeners["wants_step_logged"])

    def _keys(self) -> list[str]:
        """A callback's ``state_key``, else its class and its place among those of its class:
        adding a callback of another class on resume does not move anyone's state."""
        seen: dict[str, int] = {}
        keys = []
        for callback in self.callbacks:
            name = type(callback).__qualname__
            seen[name] = seen.get(name, -1) + 1
            keys.append(getattr(callback, "state_key", None) or f"{name}:{seen[name]}")
        return keys

    def state_dict(self) -> dict[str, Any]:
        return {key: state for key, c in zip(self._keys(), self.callbacks)
                if hasattr(c, "state_dict") and (state := c.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each callback gets the state saved under its key."""
        for key, callback in zip(self._keys(), self.callbacks):
            saved = state.get(key)
            if saved is not None and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(saved)

    def close(self) -> None:
        """Give back what callbacks hold (hooks, recorders) when the run ends, however it ends."""
        for callback in self.callbacks:
            if callable(getattr(callback, "close", None)):
                callback.close()

    def find(self, kind: type) -> Any:
        return next((c for c in self.callbacks if isinstance(c, kind)), None)
