"""An EMA copy of the weights too slow for the run (``step.ema_horizon``).

``EMA_DECAY_TOO_SLOW``: a mean teacher, a momentum encoder or an averaged model for
evaluation follows the trained weights as ``e <- d * e + (1 - d) * p``. After ``n`` updates
it keeps ``d ** n`` of its initialisation: a decay taken from a paper's million-step run
(0.999, 0.9999) in a run of a few hundred or thousand steps leaves the copy mostly random,
and what reads it (consistency targets, negatives, the evaluated model) is noise all run.

Measured over two trial steps on the first batch (``analyses/ema_watch.py``): the share of
the way to the trained weights that tensors outside the optimizer moved, wherever the
update is written (the loss function, the forward, an optimizer step hook). The run's
updates are counted generously (``max_steps`` times the accumulation steps, in case the
update runs per micro-batch), so a finding holds however often the update really runs.
An update written in the user's loop after ``optimizer.step()`` is outside what the
preflight runs and is not seen.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from optimus_preflight.preflight.analyses.ema_watch import EmaWatch
from optimus_preflight.preflight.analyses.trial_steps import make_runner
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import held_modules, preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRIAL_STEPS = 2  # an update written before optimizer.step() first moves the copy at the second
KEPT_AT_END = 0.5  # the copy still holds this share of its initialisation when the run ends
SHOWN = 3
ASSUMED_EPOCHS = 20  # where run_preflight got no max_steps: the run is judged as this many epochs


class EmaHorizonCheck(Check):
    """EMA_DECAY_TOO_SLOW: an exponential moving average that keeps most of its initialisation all run."""

    name = "step.ema_horizon"
    stage = Stage.STEP
    codes = ("EMA_DECAY_TOO_SLOW",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no tensor outside the optimizer follows the weights"
        held = held_modules(ctx)  # the ones the snapshot restores after the trial steps
        watch = EmaWatch.of([("", ctx.model), *((f"{name}.", module) for name, module in held)], ctx.optimizer)
        if not watch.watched:
            return
        with preserved_training_state(ctx):  # restores the model and the modules the loss holds
            ctx.model.train()
            runner = make_runner(ctx, ctx.model, ctx.optimizer, accumulation_steps=1, clip=False)
            for _ in range(TRIAL_STEPS):
                with watch.step():
                    runner.run(iter([(ctx.artifacts.first_batch, True)]))
        measured = watch.rate()
        if measured is None:
            return
        rate, names = measured
        updates = ctx.cfg.trainer.max_steps * max(1, ctx.cfg.trainer.accumulation_steps)
        if not ctx.run_length_known:
            # One epoch stands in for a length the loop never said: judge a run of many epochs.
            updates *= ASSUMED_EPOCHS
        kept = math.exp(updates * math.log1p(-rate)) if rate < 1 else 0.0
        decay = 1 - rate
        findings.data.update(decay=round(decay, 6), updates=updates, kept_at_end=round(kept, 4), tensors=names[:10])
        findings.data["summary"] = (f"{len(names)} tensor(s) follow the weights with decay {decay:.4g}: "
                                    f"{kept:.0%} of their start left after {updates:,} updates")
        if kept < KEPT_AT_END:
            return
        shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
        horizon = max(1.0, updates / 10)
        findings.warning(
            "EMA_DECAY_TOO_SLOW",
            f"{shown} follow the trained weights by an exponential moving average with decay {decay:.4g} (each update "
            f"moves them {rate:.2g} of the way), and the run has at most {updates:,} updates"
            f"{'' if ctx.run_length_known else f' (no max_steps given: {ASSUMED_EPOCHS} epochs assumed)'}: the average still holds "
            f"{kept:.0%} of its initialisation when training ends (decay ** steps = {kept:.2f}). An EMA teacher / "
            "momentum encoder / averaged model with a decay taken from a much longer run stays close to its random "
            "start, so the targets or the evaluated model it provides are mostly noise",
            f"Size the decay for {'trainer.max_steps' if ctx.recipe is not None else 'the run'}: about 1 - 10 / steps (decay {1 - 1 / horizon:.4g} here) lets the "
            "average forget its start within the run; or warm the decay up, d_t = min(decay, (1 + t) / (10 + t)).",
        )
