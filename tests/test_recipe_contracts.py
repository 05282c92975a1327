"""A recipe's contracts checked where they are called: one line naming the method, what
it returned and what is expected, exit 2; and a disk that refuses the run dir's lock
file is a storage error, not a traceback (issue 29, part B)."""

from __future__ import annotations

import errno
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimus_preflight import compose
from optimus_preflight.checkpoint.run_dir import LOCK_FILE
from optimus_preflight.errors import PreflightFailed, StorageError, UserError
from optimus_preflight.training.contracts import (
    ContractError,
    check_built,
    check_loaders,
    check_loss_output,
    check_scheduler,
    check_test_loader,
)
from tests.conftest import run_cli
from tests.test_custom_recipe import BlobsRecipe

LOSS = torch.tensor(1.5, requires_grad=True)


@pytest.mark.parametrize(("value", "described"), [
    (None, "None"),
    (3, "int 3"),
    ("loss", "str 'loss'"),
    (torch.ones(4), "a tensor of shape (4,)"),
    ((LOSS, 3, 4), "a 3-tuple (Tensor, int, int)"),
    ((LOSS, 0), "the count int 0"),
    ((LOSS, -2), "the count int -2"),
    ((LOSS, "n"), "the count str 'n'"),
    ((LOSS, torch.ones(3)), "a 2-tuple (Tensor, Tensor)"),
])
def test_a_loss_output_outside_the_contract_names_compute_loss_and_what_it_returned(value, described):
    with pytest.raises(ContractError) as caught:
        check_loss_output(value)
    text = str(caught.value)
    assert text.startswith(f"compute_loss returned {described}; expected a scalar loss tensor"), text
    assert "\n" not in text and isinstance(caught.value, UserError)


@pytest.mark.parametrize("value", [LOSS, (LOSS, 7), (LOSS, torch.tensor(7)), [LOSS, 2], torch.ones(1)])
def test_a_loss_output_inside_the_contract_passes(value):
    loss, count = check_loss_output(value)
    assert isinstance(loss, torch.Tensor) and loss.numel() == 1
    assert count is None or int(count) > 0


def test_builders_results_are_checked_by_type():
    model = nn.Linear(2, 2)
    assert check_built(model, nn.Module, "build_model") is model
    with pytest.raises(ContractError, match=r"^build_model returned None; expected a torch\.nn\.modules\.module\.Module"):
        check_built(None, nn.Module, "build_model")
    with pytest.raises(ContractError, match=r"^build_optimizer returned str 'adam'; expected a torch\.optim"):
        check_built("adam", torch.optim.Optimizer, "build_optimizer")
    assert check_scheduler(None) is None
    with pytest.raises(ContractError, match="^build_scheduler returned int 3"):
        check_scheduler(3)
    loader = [torch.ones(2)]
    assert check_loaders((loader, None)) == (loader, None)
    for wrong in (loader, (loader,), (None, None), (loader, 5)):
        with pytest.raises(ContractError, match="^build_dataloaders returned"):
            check_loaders(wrong)
    with pytest.raises(ContractError, match="^build_test_dataloader returned int 1"):
        check_test_loader(1)


def _loss(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


LOSS_RETURNS = {
    "none": lambda model, batch: None,
    "int": lambda model, batch: 3,
    "str": lambda model, batch: "loss",
    "vector": lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"),
    "triple": lambda model, batch: (_loss(model, batch), 3, 4),
    "zero_count": lambda model, batch: (_loss(model, batch), 0),
}


@pytest.mark.parametrize("kind", sorted(LOSS_RETURNS))
def test_a_run_whose_compute_loss_breaks_the_contract_stops_with_one_line(tmp_path, kind):
    recipe_class = type("BadLoss", (BlobsRecipe,), {"compute_loss": lambda self, m, b: LOSS_RETURNS[kind](m, b)})
    cfg = compose(["trainer.max_steps=3", "logging.progress=none", "preflight.enabled=false"])
    with pytest.raises(ContractError, match="^compute_loss returned "):
        recipe_class(cfg, run_dir=tmp_path / "run").run()


@pytest.mark.parametrize("kind", ["triple", "zero_count"])
def test_the_preflight_names_compute_loss_where_the_step_unpacks_its_result(tmp_path, kind):
    """The preflight reports it as its first-step error (exit 3, in preflight.json), in
    the contract's words: not ``too many values to unpack``."""
    recipe_class = type("BadLoss", (BlobsRecipe,), {"compute_loss": lambda self, m, b: LOSS_RETURNS[kind](m, b)})
    cfg = compose(["trainer.max_steps=3", "logging.progress=none"])
    with pytest.raises(PreflightFailed) as caught:
        recipe_class(cfg, run_dir=tmp_path / "run").run()
    messages = [issue.message for check in caught.value.report.checks for issue in check.issues]
    assert any("compute_loss returned " in message for message in messages), messages
    assert not any("unpack" in message for message in messages)


@pytest.mark.parametrize(("method", "value", "message"), [
    ("build_model", None, "build_model returned None"),
    ("build_optimizer", "sgd", "build_optimizer returned str 'sgd'"),
    ("build_dataloaders", None, "build_dataloaders returned None"),
    ("build_scheduler", 1.0, "build_scheduler returned float 1.0"),
])
def test_a_builder_returning_the_wrong_type_changes_nothing_in_an_existing_run_dir(tmp_path, method, value, message):
    run_dir = tmp_path / "run"
    cfg = compose(["trainer.max_steps=2", "logging.progress=none", "preflight.enabled=false"])
    BlobsRecipe(cfg, run_dir=run_dir).run()
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    broken = type("Broken", (BlobsRecipe,), {method: lambda self, *args: value})
    cfg = compose(["trainer.max_steps=4", "logging.progress=none", "preflight.enabled=false"])
    with pytest.raises(ContractError, match=f"^{message}; expected "):
        broken(cfg, run_dir=run_dir).run()
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.name != LOCK_FILE} == {
        p: t for p, t in before.items() if p.name != LOCK_FILE}


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_lock_file_the_disk_refuses_is_a_storage_error(tmp_path, monkeypatch, code):
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if str(path).endswith(LOCK_FILE):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    cfg = compose(["trainer.max_steps=2", "logging.progress=none", "preflight.enabled=false"])
    with pytest.raises(StorageError) as caught:
        BlobsRecipe(cfg, run_dir=tmp_path / "run").run()
    text = str(caught.value)
    assert LOCK_FILE in text and errno.errorcode[code] in text and "hydra.run.dir" in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_run_dir_is_a_storage_error(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    try:
        cfg = compose(["trainer.max_steps=2", "logging.progress=none", "preflight.enabled=false"])
        with pytest.raises(StorageError, match=LOCK_FILE):
            BlobsRecipe(cfg, run_dir=run_dir).run()
    finally:
        run_dir.chmod(0o755)


@pytest.mark.slow
def test_the_cli_names_compute_loss_with_the_preflight_off_and_on(tmp_path):
    (tmp_path / "bad_loss.py").write_text(textwrap.dedent("""
        from optimus_preflight.recipes.char_lm import CharLMRecipe

        class BadLoss(CharLMRecipe):
            def compute_loss(self, model, batch):
                loss, count = super().compute_loss(model, batch)
                return loss, count, 0
    """))
    for preflight, code in (("false", 2), ("true", 3)):
        result = run_cli(tmp_path / preflight, "recipe=char_lm_tiny", "recipe._target_=bad_loss.BadLoss",
                         "trainer.max_steps=2", f"preflight.enabled={preflight}", cwd=tmp_path)
        assert result.returncode == code, result.output
        assert "Traceback" not in result.output and "unpack" not in result.output
        assert "compute_loss returned a 3-tuple (Tensor, int, int); expected a scalar loss tensor" in result.output
