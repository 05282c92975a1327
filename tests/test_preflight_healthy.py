"""The whole default preflight stays quiet on healthy setups (issue 15): the default
char-LM, an MLP and a CNN (with BatchNorm) fed by a plain ``DataLoader(shuffle=True)``, and
tiny Hugging Face GPT-2, Llama and BERT models built from configs, trained through a recipe
subclass. A check that warns on these warns on most users' first run, and is then ignored
when it matters. Each check's firing on a broken setup is tested beside the check."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import PreflightReport
from optimus_preflight.preflight.defaults import DEFAULT_CHECKS
from optimus_preflight.recipe import TrainRecipe
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config

# The checks that are skipped on this machine or by default, so that "every check ran" means
# every check that can: a CUDA-only estimate, the opt-in runs and the multi-process count.
OPT_IN = {"step.overfit", "step.lr_finder"}


def _shapes_data(samples: int = 256) -> TensorDataset:
    """Images whose class is the brighter quadrant, normalised as torchvision's Normalize
    leaves them: per-channel mean ~0, std ~1."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (samples,), generator=generator)
    images = torch.randn(samples, 3, 16, 16, generator=generator)
    for index, label in enumerate(labels.tolist()):
        row, col = divmod(label, 2)
        images[index, :, row * 8:(row + 1) * 8, col * 8:(col + 1) * 8] += 1.0
    return TensorDataset((images - images.mean((0, 2, 3), keepdim=True)) / images.std((0, 2, 3), keepdim=True), labels)


def _tabular_data(samples: int = 512) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, 12, generator=generator)
    weights = torch.randn(12, 3, generator=generator)
    return TensorDataset(features, (features @ weights).argmax(1))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4),
    )


class _TokenRows(Dataset):
    """Fixed-length token windows from a repeating pattern (a learnable stream), as dicts."""

    def __init__(self, vocab: int, length: int = 16, rows: int = 256, classify: bool = False, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        stream = torch.randint(3, vocab, (rows * length + 1,), generator=generator)
        self.rows = stream[: rows * length].view(rows, length)
        self.classify = classify

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.rows[index]
        labels = ids[0] % 2 if self.classify else ids.clone()
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _recipe_class(model_fn, data_fn, loss=None, val_fn=None) -> type[TrainRecipe]:
    def build_dataloaders(self):
        generator = torch.Generator().manual_seed(0)
        train = DataLoader(data_fn(), batch_size=16, shuffle=True, generator=generator)
        return train, (DataLoader(val_fn(), batch_size=16) if val_fn else None)

    namespace = {"build_model": lambda self: model_fn(), "build_dataloaders": build_dataloaders}
    if loss is not None:
        namespace["compute_loss"] = lambda self, model, batch: loss(model, batch)
    return type("HealthyRecipe", (TrainRecipe,), namespace)


def _hf_loss(model, batch):
    return model(**batch).loss


def _hf_recipe(family: str) -> type[TrainRecipe]:
    transformers = pytest.importorskip("transformers")
    vocab = 97
    if family == "gpt2":
        def build():
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(
                vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    elif family == "llama":
        def build():
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(
                vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    else:
        def build():
            return transformers.BertForSequenceClassification(transformers.BertConfig(
                vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=32, num_labels=2))
    classify = family == "bert"
    return _recipe_class(build, lambda: _TokenRows(vocab, classify=classify), loss=_hf_loss,
                         val_fn=lambda: _TokenRows(vocab, rows=64, classify=classify, seed=1))


def _image_loss(model, batch):
    images, labels = batch
    return F.cross_entropy(model(images), labels)


HEALTHY = {
    "mlp": lambda: _recipe_class(_mlp, _tabular_data),
    "cnn": lambda: _recipe_class(_cnn, _shapes_data, loss=_image_loss),
    "gpt2": lambda: _hf_recipe("gpt2"),
    "llama": lambda: _hf_recipe("llama"),
    "bert": lambda: _hf_recipe("bert"),
}


def _preflight(recipe_class: type[TrainRecipe], tmp_path, *overrides: str) -> PreflightReport:
    cfg = tiny_config("trainer.max_steps=50", "scheduler.warmup_steps=5", *overrides)
    return recipe_class(cfg, run_dir=tmp_path / "run").preflight()


def _loud(report: PreflightReport) -> list[str]:
    return [f"{result.name}: {issue.severity.value} {issue.code} {issue.message}"
            for result in report.checks for issue in result.issues if issue.severity.value != "info"]


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_the_whole_preflight_is_quiet_on_a_healthy_recipe(tmp_path, name):
    report = _preflight(HEALTHY[name](), tmp_path)
    assert _loud(report) == []
    ran = {result.name for result in report.checks}
    assert {cls.name for cls in DEFAULT_CHECKS} - OPT_IN - {"step.accumulation"} <= ran


def test_the_whole_preflight_is_quiet_on_the_default_char_lm_with_accumulation(tmp_path):
    report = _preflight(CharLMRecipe, tmp_path, "trainer.accumulation_steps=2")
    assert _loud(report) == []
    assert "step.accumulation" in {result.name for result in report.checks}


def test_the_readme_lists_every_default_check_and_every_catalog_entry():
    """The README's check table names each default check, and its catalog table gives each
    entry of the troubleshooting catalog (O1-O26, DP1-DP15) a row: a check, or why none."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing_checks = [cls.name for cls in DEFAULT_CHECKS if f"`{cls.name}`" not in readme]
    assert missing_checks == []
    rows = [line for line in readme.splitlines() if line.startswith("| O") or line.startswith("| DP")]
    covered: set[str] = set()
    for row in rows:
        entry = row.split("|")[1]
        for first, last in re.findall(r"(O\d+|DP\d+)(?:-(O\d+|DP\d+))?", entry):
            prefix = "DP" if first.startswith("DP") else "O"
            end = int((last or first)[len(prefix):])
            covered.update(f"{prefix}{n}" for n in range(int(first[len(prefix):]), end + 1))
    expected = {f"O{n}" for n in range(1, 27)} | {f"DP{n}" for n in range(1, 16)}
    assert expected - covered == set()
