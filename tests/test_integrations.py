"""The preflight as a callback in the two loops users already have: Lightning's ``fit``
and the Hugging Face ``Trainer``. Tiny models built from code/configs, no download.

For each: a healthy run passes quietly, writes preflight.json, and trains to bitwise the
same weights as without the callback; a broken one is stopped before it trains."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight.framework import Severity


def loud(report):
    return [(check.name, issue.code) for check, issue in report.issues() if issue.severity != Severity.INFO]


# ---------------------------------------------------------------- Lightning

@pytest.fixture
def lightning():
    pl = pytest.importorskip("pytorch_lightning", reason="the lightning extra is not installed")
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    return pl


def lightning_module(pl, detach_loss: bool = False):
    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(20, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            loss = nn.functional.cross_entropy(self.net(inputs), targets)
            self.log("train_loss", loss)  # must not record preflight values
            return loss.detach().requires_grad_() if detach_loss else loss

        def configure_optimizers(self):
            from optimus_preflight.training.optim import weight_decay_groups

            optimizer = torch.optim.AdamW(weight_decay_groups(self, 0.01, decay_bias_and_norm=False), lr=3e-3)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Classifier()


def fit_lightning(pl, root, callbacks, detach_loss=False):
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 20, generator=generator)
    loader = DataLoader(TensorDataset(inputs, inputs[:, :3].argmax(1)), batch_size=32, shuffle=True)
    module = lightning_module(pl, detach_loss)
    trainer = pl.Trainer(max_steps=12, accumulate_grad_batches=2, gradient_clip_val=1.0, default_root_dir=root,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks, accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on num_workers for a toy loader
        trainer.fit(module, loader)
    return module, trainer


def test_lightning_callback_checks_before_fit_and_changes_nothing(lightning, tmp_path):
    from optimus_preflight.integrations.lightning import PreflightCallback

    plain, _ = fit_lightning(lightning, tmp_path / "plain", [])
    callback = PreflightCallback()
    checked, trainer = fit_lightning(lightning, tmp_path / "checked", [callback])
    assert callback.report is not None and loud(callback.report) == []
    assert callback.report.check("step.accumulation") is not None  # accumulate_grad_batches=2 was read
    assert json.loads((tmp_path / "checked" / "preflight.json").read_text())["status"] == "passed"
    assert trainer.global_step == 12 and "train_loss" in trainer.callback_metrics
    for (name, a), (_, b) in zip(plain.state_dict().items(), checked.state_dict().items()):
        assert torch.equal(a, b), name


def test_lightning_callback_stops_a_fit_that_cannot_learn(lightning, tmp_path):
    """A loss cut from the graph (detached, then requires_grad_ again) gives no gradient to
    any parameter: fit must not start."""
    from optimus_preflight.integrations.lightning import PreflightCallback

    callback = PreflightCallback()
    with pytest.raises(PreflightFailed):
        fit_lightning(lightning, tmp_path, [callback], detach_loss=True)
    assert callback.report.failed
    assert any(issue.severity == Severity.ERROR for _, issue in callback.report.issues())


# ---------------------------------------------------------------- Hugging Face

@pytest.fixture
def hf():
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("accelerate", reason="the hf extra is not installed (Trainer needs accelerate)")
    transformers.utils.logging.set_verbosity_error()
    return transformers


class Tokens(Dataset):
    def __init__(self, vocab: int, mask_labels: bool = False):
        self.data = torch.randint(0, vocab, (64, 16), generator=torch.Generator().manual_seed(1))
        self.mask_labels = mask_labels

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        labels = torch.full_like(self.data[index], -100) if self.mask_labels else self.data[index]
        return {"input_ids": self.data[index], "labels": labels}


def train_hf(transformers, out, callbacks, mask_labels=False):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=6, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_steps=100, seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(97, mask_labels), callbacks=callbacks)
    result = trainer.train()
    return model, result


def test_hf_callback_checks_before_the_first_step_and_changes_nothing(hf, tmp_path):
    from optimus_preflight.integrations.huggingface import PreflightTrainerCallback

    plain, plain_result = train_hf(hf, tmp_path / "plain", [])
    callback = PreflightTrainerCallback()
    checked, checked_result = train_hf(hf, tmp_path / "checked", [callback])
    report = callback.report
    # accelerate shards the Trainer's RandomSampler inside a batch sampler: no DP14 false alarm.
    assert report is not None and loud(report) == []
    assert report.check("step.accumulation") is not None
    assert json.loads((tmp_path / "checked" / "preflight.json").read_text())["status"] == "passed"
    assert checked_result.training_loss == plain_result.training_loss
    for (name, a), (_, b) in zip(plain.state_dict().items(), checked.state_dict().items()):
        assert torch.equal(a, b), name


def test_hf_callback_stops_a_run_whose_labels_are_all_ignored(hf, tmp_path):
    """Every label -100 (a collator that masks everything): the loss is NaN from step one."""
    from optimus_preflight.integrations.huggingface import PreflightTrainerCallback

    callback = PreflightTrainerCallback()
    with pytest.raises(PreflightFailed):
        train_hf(hf, tmp_path, [callback], mask_labels=True)
    assert callback.report.failed
