"""A user's ``torch.autograd.Function`` whose backward is not its forward's derivative.

The probe records each user Function's first call; ``custom_functions.audit_function``
compares its backward with finite differences of its forward (see there for what is
left out on purpose: identity forwards, straight-through estimators, random forwards).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimus_preflight.preflight.analyses.custom_functions import (
    BackwardMismatch,
    audit_function,
    definition_site,
    describe_ratio,
    none_gradients,
)
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# A backward off by less than this factor still points the right way; Adam undoes a constant one.
SCALE_SLACK = 1.5


def _ordinal(position: int) -> str:
    return {0: "first", 1: "second", 2: "third", 3: "fourth"}.get(position, f"#{position + 1}")


class CustomBackwardCheck(Check):
    """Each of the user's autograd Functions run in the first step: its backward agrees with
    finite differences of its forward."""

    name = "step.custom_backward"
    stage = Stage.STEP
    codes = ("CUSTOM_BACKWARD_WRONG", "CUSTOM_BACKWARD_SCALED", "CUSTOM_BACKWARD_NONE")
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        calls = get_probe(ctx).custom_functions
        findings.data["functions"] = [call.cls.__name__ for call in calls]
        if not calls:
            findings.data["summary"] = "no autograd.Function of the user's in the step"
            return
        for call in calls:
            missing = none_gradients(call)
            if missing:
                name = call.cls.__name__
                findings.warning(
                    "CUSTOM_BACKWARD_NONE",
                    f"{name}.backward (defined at {definition_site(call.cls)}) returns None for the "
                    f"{_ordinal(missing[0])} input of forward, which requires grad: autograd passes no gradient "
                    f"through {name}, so every layer before it never trains. A backward that computes grad_input "
                    "but has no return statement returns None",
                    f"End {name}.backward with `return grad_input` (one gradient per input of forward, None only "
                    "for inputs that need none).",
                )
        mismatches = [found for found in (audit_function(call) for call in calls) if found is not None]
        findings.data["summary"] = f"{len(calls) - len(mismatches)}/{len(calls)} custom autograd Function(s) agree"
        for found in mismatches:
            _report(found, findings)


def _report(found: BackwardMismatch, findings: Findings) -> None:
    name = found.function
    subject = (f"{name}.backward (defined at {found.where}) returns, for the {_ordinal(found.position)} input of "
               f"forward (shape {found.shape}), a gradient")
    fix = (f"Make {name}.backward return, for each input of forward in order, grad_output times the derivative of "
           f"forward's output with respect to that input (the chain rule), and None for inputs that need none; "
           f"verify it with torch.autograd.gradcheck({name}.apply, inputs) on small float64 inputs with "
           f"requires_grad=True. If forward is made of torch operations only, drop the Function and let autograd "
           f"differentiate forward.")
    if found.kind == "scale" and found.ratio is not None:
        if 1 / SCALE_SLACK <= found.ratio <= SCALE_SLACK:
            return
        findings.warning(
            "CUSTOM_BACKWARD_SCALED",
            f"{subject} {describe_ratio(found.ratio)} times the derivative of its forward, measured by finite "
            f"differences in float64. The direction is right, the size is not: under SGD everything behind the "
            f"Function trains at a learning rate scaled by that factor, and where other paths reach the same weights "
            f"their gradients are mixed in the wrong proportion",
            fix,
        )
        return
    if found.kind == "sign" and found.ratio is not None:
        what = (f"that points against the derivative of its forward ({describe_ratio(found.ratio)} times it, measured "
                f"by finite differences in float64): gradient descent through it climbs the loss")
    else:
        what = (f"that is not the derivative of its forward: along random directions, the change it predicts and the "
                f"change finite differences of forward measure (float64) differ by {found.relative_error:.0%} "
                f"(a chain-rule factor such as grad_output left out, a derivative of another function, gradients "
                f"returned in another order than forward's inputs)")
    findings.error(
        "CUSTOM_BACKWARD_WRONG",
        f"{subject} {what}. Autograd trusts a Function's backward, so the weights behind it move along a direction "
        f"the loss does not go, and nothing crashes",
        fix,
    )
