"""Recipes that break one contract each, for benchmarks/bad_inputs.py: what a user's first
draft of a recipe returns by mistake."""

from __future__ import annotations

import torch

from optimus_preflight.recipes.char_lm import CharLMRecipe


class LossReturnsNone(CharLMRecipe):
    def compute_loss(self, model, batch):
        super().compute_loss(model, batch)  # forgot the return


class LossReturnsString(CharLMRecipe):
    def compute_loss(self, model, batch):
        return "loss"


class LossReturnsVector(CharLMRecipe):
    def compute_loss(self, model, batch):
        inputs, targets = batch
        logits = model(inputs)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")


class ModelIsNone(CharLMRecipe):
    def build_model(self):
        super().build_model()  # forgot the return


class OptimizerIsString(CharLMRecipe):
    def build_optimizer(self, model):
        return "adamw"
