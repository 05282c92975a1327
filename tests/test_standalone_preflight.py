"""``run_preflight`` from a plain PyTorch loop: the same checks as a recipe, fixes phrased
for the user's own code, and the loop's training bitwise unchanged by the call."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler, TensorDataset

from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.framework import CheckStatus, Severity
from optimus_preflight.training.optim import weight_decay_groups

FEATURES, CLASSES = 20, 3


def data(samples: int = 256) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, (inputs[:, :CLASSES].argmax(1)))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, CLASSES))


def healthy_setup(seed: int = 0):
    torch.manual_seed(seed)
    model = mlp()
    optimizer = torch.optim.AdamW(weight_decay_groups(model, 0.01, decay_bias_and_norm=False), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=16)
    loader = DataLoader(data(), batch_size=32, shuffle=True)
    return model, optimizer, scheduler, loader


def train(model, optimizer, scheduler, loader, epochs: int = 2) -> list[float]:
    """The loop a user already has."""
    losses = []
    criterion = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = criterion(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    return losses


def warnings_and_errors(report):
    return [(check.name, issue) for check, issue in report.issues() if issue.severity != Severity.INFO]


def test_a_plain_loop_is_quiet_and_trains_bitwise_as_without_the_preflight(tmp_path):
    model, optimizer, scheduler, loader = healthy_setup()
    baseline = train(model, optimizer, scheduler, loader)
    reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    model, optimizer, scheduler, loader = healthy_setup()
    report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss(), scheduler=scheduler,
                           clip_grad_norm=1.0, max_steps=16, overfit_steps=20, run_dir=tmp_path)
    assert warnings_and_errors(report) == [] and report.status == "passed"
    ran = {check.name for check in report.checks if check.status == CheckStatus.PASSED}
    assert {"data.first_batch", "step.first_step", "step.overfit", "step.checkpoint", "memory.host_ram"} <= ran
    assert json.loads((tmp_path / "preflight.json").read_text())["status"] == "passed"

    # Same losses and weights: the weights, optimizer, scheduler, RNG and the shuffling
    # sampler's order are what they were before the call.
    assert train(model, optimizer, scheduler, loader) == baseline
    assert all(torch.equal(tensor, reference[name]) for name, tensor in model.state_dict().items())


def test_without_run_dir_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, optimizer, _, loader = healthy_setup()
    report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss())
    assert report.status == "passed"
    assert list(tmp_path.iterdir()) == []


def test_fixes_name_the_users_code_not_config_keys():
    """An unshuffled loader, Adam with coupled decay on every tensor, accumulation that the
    preflight is told about: every fix must be doable in a plain loop."""
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.1)
    loader = DataLoader(data(), batch_size=32, shuffle=False)
    report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss())
    assert "DP14" in {issue.code for _, issue in warnings_and_errors(report)}
    assert "O6" in {issue.code for _, issue in report.issues()}  # a note: Adam's coupled decay
    for _, issue in report.issues():
        assert issue.config_key is None
        for group in ("data.", "optimizer.", "model.", "trainer.", "preflight."):
            assert f"Set {group}" not in issue.fix, issue.fix
        assert "build_dataloaders" not in issue.fix and "build_optimizer" not in issue.fix
    dp14 = next(issue for _, issue in report.issues() if issue.code == "DP14")
    assert "shuffle=True" in dp14.fix and "DataLoader you train with" in dp14.fix


def test_a_nan_loss_fails_and_raise_on_failure_raises(tmp_path):
    model, optimizer, _, loader = healthy_setup()

    def broken_loss(model, batch):
        inputs, targets = batch
        return nn.functional.cross_entropy(model(inputs), targets) * float("nan")

    with pytest.raises(PreflightFailed) as failed:
        run_preflight(model, optimizer, loader, loss_fn=broken_loss, raise_on_failure=True, run_dir=tmp_path)
    assert failed.value.report.failed
    report = run_preflight(model, optimizer, loader, loss_fn=broken_loss, fail_on="never")
    assert not report.failed and any(issue.severity == Severity.ERROR for _, issue in report.issues())


class BlockedDataset(Dataset):
    """Every sample waits for ``release``: a hang the test can end."""

    def __init__(self, release: threading.Event):
        self.release = release

    def __len__(self):
        return 64

    def __getitem__(self, index):
        self.release.wait(600)
        return torch.zeros(FEATURES), torch.tensor(0)


def test_a_hanging_dataset_is_reported_not_waited_for():
    release = threading.Event()
    try:
        torch.manual_seed(0)
        model = mlp()
        optimizer = torch.optim.AdamW(model.parameters())
        loader = DataLoader(BlockedDataset(release), batch_size=4)
        report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss(), first_batch_timeout_s=2.0)
    finally:
        release.set()
    first = report.check("data.first_batch")
    assert report.failed and first.issues and first.issues[0].severity == Severity.ERROR
    assert "__getitem__" in first.issues[0].message or "release.wait" in first.issues[0].message


@pytest.mark.parametrize(("inner", "fires"), [(RandomSampler, False), (SequentialSampler, True)])
def test_a_batch_sampler_is_judged_by_the_sampler_inside_it(inner, fires):
    """DataLoader(batch_sampler=...) leaves loader.sampler a placeholder SequentialSampler."""
    torch.manual_seed(0)
    dataset = data()
    model = mlp()
    loader = DataLoader(dataset, batch_sampler=BatchSampler(inner(dataset), batch_size=32, drop_last=False))
    report = run_preflight(model, torch.optim.AdamW(weight_decay_groups(model, 0.01, decay_bias_and_norm=False)), loader,
                           loss_fn=nn.CrossEntropyLoss())
    assert ("DP14" in report.codes()) == fires


@pytest.mark.parametrize(("keyword", "value"), [("precision", "fp8"), ("accumulation_steps", 0),
                                                ("max_steps", -1), ("fail_on", "sometimes")])
def test_bad_settings_are_refused_by_name(keyword, value):
    model, optimizer, _, loader = healthy_setup()
    with pytest.raises(ValueError, match=keyword):
        run_preflight(model, optimizer, loader, **{keyword: value})


def test_default_loss_reads_hugging_face_style_outputs():
    """A mapping batch goes to model(**batch) and its .loss is the loss."""

    class Output(dict):
        @property
        def loss(self):
            return self["loss"]

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, features, labels):
            return Output(loss=nn.functional.cross_entropy(self.body(features), labels))

    class Mapped(Dataset):
        def __init__(self):
            self.inner = data(64)

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, index):
            features, labels = self.inner[index]
            return {"features": features, "labels": labels}

    torch.manual_seed(0)
    model = WithLoss()
    report = run_preflight(model, torch.optim.AdamW(weight_decay_groups(model, 0.01, decay_bias_and_norm=False)),
                           DataLoader(Mapped(), batch_size=16, shuffle=True))
    assert report.check("step.first_step").status == CheckStatus.PASSED
    assert warnings_and_errors(report) == []


def test_a_model_with_uninitialised_lazy_modules_is_refused_with_the_fix():
    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(3))
    loader = DataLoader(TensorDataset(torch.randn(32, 4, 4), torch.randint(0, 3, (32,))), batch_size=8)
    with pytest.raises(ValueError, match=r"lazy module\(s\) of the model \(1\).*call the model once on a batch"):
        run_preflight(model, torch.optim.SGD(model.parameters(), 0.1), loader, loss_fn=nn.CrossEntropyLoss())
    model(next(iter(loader))[0])  # the dry run torch recommends: now it has weights to check
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.1), loader, loss_fn=nn.CrossEntropyLoss())
    assert not report.failed


@pytest.mark.parametrize("as_tuple", [True, False], ids=["tensor_dataset_of_one", "bare_tensors"])
def test_a_criterion_on_batches_of_one_tensor_scores_a_reconstruction(as_tuple):
    # TensorDataset(x) with nn.MSELoss() is an autoencoder: its target is its input.
    from optimus_preflight.preflight.standalone import loss_adapter

    x = torch.rand(256, 16, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 16))
    batch = (x[:8],) if as_tuple else x[:8]
    assert torch.equal(loss_adapter(nn.MSELoss())(model, batch), nn.functional.mse_loss(model(x[:8]), x[:8]))
    data = TensorDataset(x) if as_tuple else x
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), max_steps=100)
    assert not [(c.name, i.code) for c in report.checks for i in c.issues if i.severity.value in ("warning", "error")]
