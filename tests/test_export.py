"""optimus-export: the model of any checkpoint as model_step_N.safetensors and .pt."""

from __future__ import annotations

import pytest
import torch

from optimus_preflight.checkpoint import export as export_module
from optimus_preflight.checkpoint.export import export, export_files, run
from optimus_preflight.checkpoint.store import CheckpointStore
from tests.test_checkpoint_legacy import write_format_3

safetensors_torch = pytest.importorskip("safetensors.torch")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model.register_buffer("tied_view", model[0].weight.detach()[:1])  # shares memory with a weight
    return model


def _run_dir(tmp_path, model) -> None:
    optimizer = torch.optim.AdamW(model.parameters())
    CheckpointStore(tmp_path / "checkpoints", run_id="r").save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "run_state": {"step": 2}}, 2)


def _same(model, state) -> bool:
    return all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items()) and set(state) == set(model.state_dict())


def test_a_run_dir_exports_both_formats_with_the_same_weights(tmp_path, capsys):
    model = _model()
    _run_dir(tmp_path, model)
    assert run([str(tmp_path)]) == 0
    out = tmp_path / "export"
    assert sorted(p.name for p in out.iterdir()) == ["model_step_00000002.pt", "model_step_00000002.safetensors"]
    assert _same(model, safetensors_torch.load_file(out / "model_step_00000002.safetensors"))
    assert _same(model, torch.load(out / "model_step_00000002.pt", weights_only=True))
    assert capsys.readouterr().out.count("optimus-export:") == 2


def test_one_format_by_flag_or_by_the_suffix_of_out(tmp_path):
    model = _model()
    _run_dir(tmp_path, model)
    assert run([str(tmp_path), "--format", "pt"]) == 0
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["model_step_00000002.pt"]
    _, out, _ = export(tmp_path, tmp_path / "weights.safetensors")
    assert out.name == "weights.safetensors" and _same(model, safetensors_torch.load_file(out))
    assert run([str(tmp_path), "--format", "both", "--out", str(tmp_path / "x.pt")]) == 2


def test_an_old_format_checkpoint_exports_too(tmp_path):
    model = _model()
    write_format_3(tmp_path / "checkpoints" / "step_00000001", {"model": model.state_dict(), "run_state": {"step": 1}}, 1)
    _, written = export_files(tmp_path)
    assert _same(model, safetensors_torch.load_file(written["safetensors"][0]))


def test_without_safetensors_the_default_writes_the_pt_and_says_so(tmp_path, monkeypatch, capsys):
    _run_dir(tmp_path, _model())
    monkeypatch.setattr(export_module, "have_safetensors", lambda: False)
    assert run([str(tmp_path)]) == 0
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["model_step_00000002.pt"]
    assert "optimus_preflight[safetensors]" in capsys.readouterr().err
    assert run([str(tmp_path), "--format", "safetensors"]) == 2
    assert "pip install 'optimus_preflight[safetensors]'" in capsys.readouterr().err
