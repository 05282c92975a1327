"""Learnable-looking terms stored as buffers, constant forever (``model.constant_buffers``).

``register_buffer`` is for state the optimizer must not touch (running statistics, masks,
fixed encodings): buffers are not in ``model.parameters()``. Thresholds, biases or scales
written as ``self.register_buffer("thresholds", torch.zeros(k))`` "so they follow
``.to(device)``" never train: an added zero stays zero and a multiplied one stays one, so the
term does nothing all run (CORAL's rank thresholds all at 0 make the levels indistinguishable).

Read from one eval-mode forward on the first batch: float buffers holding one value (0, or 1)
that the forward adds to, subtracts from, multiplies or divides a tensor of the batch's
samples by. Normalisation layers' running statistics, and buffers of torch's own layers and of
library models (Hugging Face BART keeps a zero ``final_logits_bias`` on purpose), are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ADDING = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "rsub"}
SCALING = {"mul", "__mul__", "__rmul__", "div", "__truediv__", "__rtruediv__"}
NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
LIBRARIES = ("torch", "transformers", "torchvision", "torchaudio", "timm")


def constant_buffers(model: nn.Module) -> dict[int, tuple[str, float]]:
    """id -> (name, value) of the model's float buffers (two values or more) that hold one value,
    0 or 1, outside normalisation layers (pure on the model)."""
    found = {}
    for module_name, module in model.named_modules():
        # torch's own layers and library models keep such buffers by design (BART's final_logits_bias)
        if isinstance(module, NORMS) or type(module).__module__.split(".")[0] in LIBRARIES:
            continue
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is None or not buffer.is_floating_point() or buffer.numel() < 2 or buffer.layout != torch.strided:
                continue
            first = float(buffer.reshape(-1)[0])
            if first in (0.0, 1.0) and bool((buffer == first).all()):
                found[id(buffer)] = (f"{module_name}.{name}" if module_name else name, first)
    return found


class IdentityUses(TorchFunctionMode):
    """Records the constant buffers an op adds (0) or scales by (1) into a tensor of the batch."""

    def __init__(self, buffers: dict[int, tuple[str, float]], rows: int) -> None:
        super().__init__()
        self.buffers, self.rows = buffers, rows
        self.used: dict[str, str] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ADDING or name in SCALING:
            tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
            held = [self.buffers[id(a)] for a in tensors if id(a) in self.buffers]
            others = [a for a in tensors if id(a) not in self.buffers and a.dim() >= 1 and a.shape[0] == self.rows]
            for buffer_name, value in held:
                if others and ((name in ADDING and value == 0.0) or (name in SCALING and value == 1.0)):
                    self.used.setdefault(buffer_name, "added to" if name in ADDING else "multiplied into")
        return func(*args, **kwargs)


class ConstantBuffersCheck(Check):
    """BUFFER_NEVER_TRAINED: a buffer of zeros added (or of ones multiplied) into the model's activations."""

    name = "model.constant_buffers"
    stage = Stage.STEP
    codes = ("BUFFER_NEVER_TRAINED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        buffers = constant_buffers(ctx.model)
        rows = batch_size_of(ctx.artifacts.first_batch)
        if not buffers or not rows:
            findings.data["summary"] = "no constant float buffer"
            return
        watch = IdentityUses(buffers, rows)
        try:
            with watch:
                eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        findings.data["summary"] = f"{len(watch.used)} constant buffer(s) used as an identity term"
        if not watch.used:
            return
        shown = ", ".join(f"'{name}' ({how} the activations)" for name, how in list(watch.used.items())[:4])
        findings.warning(
            "BUFFER_NEVER_TRAINED",
            f"the forward uses buffers that hold one constant value as learnable terms: {shown}. A buffer "
            "(register_buffer) is not in model.parameters(), so the optimizer never updates it: a buffer of zeros "
            "added stays 0 and a buffer of ones multiplied stays 1 for the whole run, so the term does nothing "
            "(thresholds, biases or scales meant to be learned: CORAL's rank thresholds all at 0)",
            "Register learnable terms as parameters: self.thresholds = nn.Parameter(torch.zeros(k)) (they follow "
            ".to(device) and the state_dict all the same); keep register_buffer for state that must not train.",
        )
