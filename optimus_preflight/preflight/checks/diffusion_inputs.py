"""A noise-prediction diffusion loss whose model input does not hold what it should
(``step.diffusion_inputs``; the measurements are ``analyses.diffusion_inputs``).

``DIFFUSION_NOISE_NEVER_LOW``: every sample's ``x_t`` is its noise, even the least noisy one:
``alphas_cumprod = cumprod(betas)``. ``DIFFUSION_DATA_SCALE``: the clean data's std is far from
the unit variance the noise schedule is made for. ``DIFFUSION_TARGET_NOT_IN_INPUT``: the noise
the model is asked for is uncorrelated with ``x_t``: drawn a second time. (``step.targets``
reports the opposite schedule mistake, ``DIFFUSION_NOISE_NEVER_HIGH``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimus_preflight.preflight.analyses.diffusion_inputs import PURE_NOISE, SCALE_RANGE, UNRELATED_NOISE
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


class DiffusionInputsCheck(Check):
    """What x_t holds in a noise-prediction diffusion step: data, noise, and the target's noise."""

    name = "step.diffusion_inputs"
    stage = Stage.STEP
    codes = ("DIFFUSION_NOISE_NEVER_LOW", "DIFFUSION_DATA_SCALE", "DIFFUSION_TARGET_NOT_IN_INPUT")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        inputs = get_probe(ctx).diffusion_inputs
        if inputs is None:
            findings.data["summary"] = "no noise-prediction diffusion loss"
            return
        findings.data.update(clean_std=round(inputs.clean_std, 4), least_noisy=round(inputs.least_noisy, 4),
                             target_correlation=round(inputs.target_correlation, 4))
        findings.data["summary"] = (f"x_t of {inputs.rows} samples: data std {inputs.clean_std:.3g}, "
                                    f"corr(x_t, target noise) {inputs.target_correlation:+.2f}")
        if inputs.pure_noise:
            findings.warning(
                "DIFFUSION_NOISE_NEVER_LOW",
                f"every one of the {inputs.rows} samples the diffusion loss feeds its model is pure noise: even the "
                f"least noisy x_t is within {inputs.least_noisy:.1%} of the noise drawn for it (at most "
                f"{PURE_NOISE:.0%}), where samples at small timesteps should be almost the clean data. The model never "
                "sees the data it must learn to generate. alphas_cumprod built as torch.cumprod(betas, 0), whose "
                "values are all near 0, where torch.cumprod(1 - betas, 0) was meant, does this (so does a schedule "
                "indexed from its end)",
                "Build alpha_bar = torch.cumprod(1 - betas, dim=0) (near 1 at t = 0, near 0 at the last step) and "
                "x_t = alpha_bar[t].sqrt() * x0 + (1 - alpha_bar[t]).sqrt() * noise.",
            )
        elif inputs.off_scale:
            findings.warning(
                "DIFFUSION_DATA_SCALE",
                f"the clean data the diffusion loss noises has a std of {inputs.clean_std:.3g}, while its noise is "
                f"standard normal: the noise schedule assumes data of about unit variance (in [-1, 1] or standardised,"
                f" {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g}), so the signal-to-noise ratio is off by "
                f"{max(inputs.clean_std, 1 / inputs.clean_std) ** 2:.3g}x at every timestep: the data drowns the "
                "noise (or the reverse), the last timestep is not pure noise and sampling starts from the wrong "
                "distribution",
                "Scale the data to [-1, 1] (images: x / 127.5 - 1) or standardise it with the training set's mean and "
                "std before noising, and undo it on the samples; for latent diffusion multiply the latents by the "
                "autoencoder's scaling factor.",
            )
        elif inputs.target_not_in_input:
            findings.error(
                "DIFFUSION_TARGET_NOT_IN_INPUT",
                f"the noise the diffusion model is asked to predict is not the noise in its input: over the batch, "
                f"corr(x_t, target) is {inputs.target_correlation:+.3f} (under {UNRELATED_NOISE:g}; the noise mixed "
                "into x_t correlates with it at every timestep). The target is a second draw, target = "
                "torch.randn_like(x0) after x_t was built from another one, so the best prediction is 0 and the "
                "model learns nothing about denoising",
                "Draw the noise once and use it for both: noise = torch.randn_like(x0); x_t = a * x0 + b * noise; "
                "loss = F.mse_loss(model(x_t, t), noise).",
            )
