"""A warm-up counted in samples where the loss counts steps (``model.warmup_length``).

``WARMUP_IN_SAMPLES``: a KL annealing (beta from 0 to 1), a curriculum or a loss-weight ramp
written in the loss function or the model with its length as ``epochs * len(dataset)``, a
count of samples, while the counter advances once per call, once per batch. The ramp then
lasts batch-size times longer than meant: beta stays near 0 for the whole run, and the
VAE trains as a plain autoencoder (or the auxiliary term never switches on).

Read from the objects the step runs: integer attributes of the loss function (an instance's
fields, a closure's variables) and of the model whose names say they are a ramp's length
(warm-up, anneal, ramp). One that is a whole multiple of the training dataset's length and
lasts many epochs of batches is the finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from optimus_preflight.preflight.analyses.declared_fields import declared_fields
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

RAMP_NAME = re.compile(r"warm|anneal|ramp", re.IGNORECASE)
MIN_EPOCHS = 20  # a ramp this many epochs of batches long, at least, before it is suspicious
MAX_MULTIPLE = 1000


def ramp_lengths(owner: Any) -> Iterator[tuple[str, int]]:
    """(name, value) of integer fields named like a ramp's length: an object's attributes, a
    function's closure variables, a bound method's object's."""
    fields = declared_fields(owner)
    for name, value in fields.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0 and RAMP_NAME.search(name):
            yield name, value


class WarmupLengthCheck(Check):
    """WARMUP_IN_SAMPLES: a loss ramp whose length is a multiple of the dataset's size."""

    name = "model.warmup_length"
    stage = Stage.MODEL
    codes = ("WARMUP_IN_SAMPLES",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no ramp length in the loss function or the model"
        try:
            samples = len(ctx.train_loader.dataset)
            batches = len(ctx.train_loader)
        except (TypeError, AttributeError, NotImplementedError):
            return
        if samples <= batches or batches < 1:
            return
        found = [(where, name, value) for where, owner in (("the loss function", ctx.compute_loss), ("the model", ctx.model))
                 for name, value in ramp_lengths(owner)]
        findings.data["ramps"] = {name: value for _, name, value in found}
        for where, name, value in found:
            multiple = value / samples
            if value % samples or not 1 <= multiple <= MAX_MULTIPLE or value < MIN_EPOCHS * batches:
                continue
            findings.data["summary"] = f"{name} = {value:,} = {multiple:g} x len(dataset)"
            findings.warning(
                "WARMUP_IN_SAMPLES",
                f"{where}'s {name} = {value:,} is {multiple:g} x len(dataset) ({samples:,} samples), a count of "
                f"samples, while a ramp's counter advances once per call, once per batch ({batches:,} batches an "
                f"epoch): the warm-up lasts {value / batches:,.0f} epochs instead of {multiple:g}. A KL "
                "annealing written this way keeps beta near 0 for the whole run, and the VAE trains as a plain "
                "autoencoder (posterior collapse follows when beta finally rises)",
                f"Count the ramp in batches: {name} = epochs * len(train_loader) (batches per epoch), not epochs * "
                "len(train_set); or advance the counter by the batch size.",
            )
            return
