"""FSDP2 under torchrun on CPU (gloo): the same losses as one process, sharded DCP
checkpoints that an interrupt writes and a resume continues bit-exactly, a resume at
another world size, and `optimus-export` of the shards as one state_dict file.

The pure parts (which modules are sharded, the strategy choice, the data position at
another world size, refusals) are tested in-process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from optimus_preflight.checkpoint import verify
from optimus_preflight.checkpoint.checkpoint_state import rescale_data_position
from optimus_preflight.checkpoint.export import export
from optimus_preflight.checkpoint.export import run as export_cli
from optimus_preflight.checkpoint.store import CheckpointCorrupt, CheckpointStore
from optimus_preflight.config.instantiate import instantiate_node
from optimus_preflight.errors import UserError
from optimus_preflight.reporting.summary import params_sha256
from optimus_preflight.training import strategy as strategy_module
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.sharding import find_blocks
from optimus_preflight.training.strategy import place_model, resolve_strategy
from optimus_preflight.training.training_context import build_training_context
from tests.conftest import REPO, run_cli, tiny_config

TINY = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=10", "trainer.eval_every_n_steps=5",
        "recipe._target_=tests.signal_recipe.SelfSignalRecipe")
FSDP = (*TINY, "data.batch_size=8", "trainer.strategy=fsdp")


# ------------------------------------------------------------------ in-process
class _GPT2Like(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(10, 8)
        self.transformer.h = nn.ModuleList(nn.TransformerEncoderLayer(8, 2, 16) for _ in range(3))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU())  # smaller list of mixed classes: not the blocks


def test_the_default_blocks_are_the_largest_list_of_repeated_modules():
    model = _GPT2Like()
    assert find_blocks(model) == list(model.transformer.h)
    char_lm = instantiate_node(tiny_config().model, "model")
    blocks = find_blocks(char_lm)
    assert len(blocks) == 2 and {type(block).__name__ for block in blocks} == {"Block"}
    assert find_blocks(nn.Linear(3, 3)) == []


def test_named_block_classes_are_matched_outermost_first_and_an_unknown_name_names_the_key():
    model = _GPT2Like()
    assert find_blocks(model, ["TransformerEncoderLayer", "Linear"])[:3] == list(model.transformer.h)
    with pytest.raises(UserError) as error:
        find_blocks(model, ["LlamaDecoderLayer"])
    assert error.value.key == "trainer.fsdp.block_classes" and "TransformerEncoderLayer" in error.value.fix


def _context(world_size: int, precision: str = "fp32"):
    cfg = tiny_config(f"trainer.precision={precision}")
    context = build_training_context(cfg.trainer, DistEnv(world_size=world_size, local_world_size=world_size))
    return cfg, context


def test_one_process_is_never_sharded_and_auto_shards_only_what_does_not_fit(monkeypatch):
    cfg, single = _context(1)
    model = nn.Linear(1000, 1000)  # 1M parameters: 16 MB of replicated training state
    cfg.trainer.strategy = "fsdp"
    assert resolve_strategy(cfg.trainer, single, model) == "single"
    cfg.trainer.strategy = "auto"
    _, pair = _context(2)
    monkeypatch.setattr(strategy_module, "device_bytes_per_rank", lambda device, local: 1 << 30)
    assert resolve_strategy(cfg.trainer, pair, model) == "ddp"
    monkeypatch.setattr(strategy_module, "device_bytes_per_rank", lambda device, local: 20 << 20)
    assert resolve_strategy(cfg.trainer, pair, model) == "fsdp"


def test_fp16_with_fsdp_and_checkpointing_without_blocks_are_refused_naming_the_key():
    cfg, context = _context(2, "fp16")
    cfg.trainer.strategy = "fsdp"
    with pytest.raises(UserError) as error:
        place_model(_GPT2Like(), cfg.trainer, context)
    assert error.value.key == "trainer.precision" and "bf16" in error.value.fix
    cfg, single = _context(1)
    cfg.trainer.activation_checkpointing = True
    with pytest.raises(UserError) as error:
        place_model(nn.Linear(3, 3), cfg.trainer, single)
    assert error.value.key == "trainer.fsdp.block_classes"


def test_activation_checkpointing_keeps_the_parameter_names_and_the_gradients():
    torch.manual_seed(0)
    plain = _GPT2Like().eval()
    checkpointed = _GPT2Like().eval()
    checkpointed.load_state_dict(plain.state_dict())
    cfg, single = _context(1)
    cfg.trainer.activation_checkpointing = True
    checkpointed, chosen = place_model(checkpointed, cfg.trainer, single)
    assert chosen == "single" and list(checkpointed.state_dict()) == list(plain.state_dict())
    x = torch.randn(4, 5, 8)
    for model in (plain, checkpointed):
        h = x
        for block in model.transformer.h:
            h = block(h)
        h.square().mean().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize(("saved", "now", "consumed", "expected"), [(2, 2, 32, 32), (2, 1, 32, 64), (1, 2, 80, 40), (2, 4, 3, 1)])
def test_the_data_position_moves_to_another_world_size(saved, now, consumed, expected):
    position, note = rescale_data_position({"epoch": 1, "samples_consumed": consumed}, saved, now)
    assert position == {"epoch": 1, "samples_consumed": expected}
    assert (note is None) == (saved == now)
    if saved == 2 and now == 4:
        assert "2 of them are read again" in note


def test_files_written_into_a_prepared_directory_join_the_manifest(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints", run_id="r")
    prepared = store.prepare(3)
    (prepared / "__0_0.distcp").write_bytes(b"shard zero")
    (prepared / ".metadata").write_bytes(b"index")
    path = store.save({"sharded": {"world_size": 2}, "run_state": {}}, 3, prepared=prepared)
    assert set(verify(path)["files"]) == {"state.pt", "__0_0.distcp", ".metadata"}
    (path / "__0_0.distcp").write_bytes(b"shard")  # truncated
    with pytest.raises(CheckpointCorrupt, match="__0_0.distcp"):
        verify(path)


@pytest.mark.slow
def test_export_of_a_single_file_checkpoint_and_its_refusals(tmp_path, capsys):
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, "recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=2",
                     "preflight.enabled=false", cwd=REPO)
    assert result.returncode == 0, result.output
    _, out, _ = export(run_dir)
    model = instantiate_node(tiny_config().model, "model")
    model.load_state_dict(torch.load(out, weights_only=True))
    assert params_sha256(model) == result.summary()["params_sha256"]
    assert export_cli([str(tmp_path / "missing")]) == 2
    assert export_cli([str(tmp_path)]) == 2
    assert "no checkpoint that verifies" in capsys.readouterr().err


# ------------------------------------------------------------ torchrun, 2 ranks
def torchrun(run_dir, *overrides, env=None):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "optimus_preflight.cli", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env={**__import__("os").environ, **(env or {})})


def records(run_dir):
    return {(r["step"], "loss" in r): r.get("loss", r.get("val_loss"))
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """An uninterrupted 2-rank FSDP run, with its preflight."""
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    result = torchrun(run_dir, *FSDP)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_fsdp_matches_one_process_with_the_same_global_batch_and_its_preflight_passes(tmp_path, fsdp_run):
    single = run_cli(tmp_path / "single", *TINY, "data.batch_size=16", cwd=REPO)
    assert single.returncode == 0, single.output
    sharded, one = records(fsdp_run), records(single.run_dir)
    assert sharded.keys() == one.keys()
    assert max(abs(sharded[key] - one[key]) for key in one) < 1e-5
    preflight = json.loads((fsdp_run / "preflight.json").read_text())
    assert preflight["status"] == "passed", [c for c in preflight["checks"] if c["status"] != "passed"]
    # Each rank wrote its own shard; the manifest covers them and the index.
    checkpoint = fsdp_run / "checkpoints" / "step_00000010"
    assert {"state.pt", ".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(verify(checkpoint)["files"])
    assert "model" not in torch.load(checkpoint / "state.pt", weights_only=True)


@pytest.mark.slow
def test_fsdp_interrupt_resumes_bit_exactly_and_at_world_size_one(tmp_path, fsdp_run):
    run_dir = tmp_path / "run"
    signal_env = {"SIGNAL_NAME": "SIGTERM", "SIGNAL_PHASE": "train", "SIGNAL_AT": "4", "SIGNAL_RANK": "1"}
    stopped = torchrun(run_dir, *FSDP, env=signal_env)  # the signal recipe counts steps after the preflight
    assert stopped.stderr.count("exitcode  : 143") == 2, stopped.stderr[-3000:]
    step_4 = run_dir / "checkpoints" / "step_00000004"
    verify(step_4)
    alone = tmp_path / "alone"
    shutil.copytree(step_4, tmp_path / "copy" / step_4.name)

    resumed = torchrun(run_dir, *FSDP, "preflight.enabled=false")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = json.loads((fsdp_run / "summary.json").read_text())
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["steps"] == 10 and final["params_sha256"] == reference["params_sha256"]
    assert records(run_dir) == records(fsdp_run)

    # The 2-rank shards into one unsharded process, with the same global batch.
    single = run_cli(alone, *TINY, "data.batch_size=16", "trainer.strategy=fsdp", "preflight.enabled=false",
                     f"checkpoint.resume={tmp_path / 'copy' / step_4.name}", cwd=REPO)
    assert single.returncode == 0, single.output
    assert "this run has 1" in single.output and "written by 2 rank(s)" in single.output
    continued, expected = records(alone), records(fsdp_run)
    assert min(step for step, _ in continued) == 5
    assert max(abs(continued[key] - expected[key]) for key in continued) < 1e-5

    # The shards gathered into one file load into the plain model.
    _, out, _ = export(run_dir)
    model = instantiate_node(tiny_config().model, "model")
    model.load_state_dict(torch.load(out, weights_only=True))
    assert params_sha256(model) == reference["params_sha256"]


FULL_INTO_SHARDED = r"""
import copy, os, sys, torch
import torch.distributed as dist
from torch import nn
from optimus_preflight.checkpoint.sharded import load_full_into_sharded, sharded_state
from optimus_preflight.training.sharding import shard_model
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
def build():
    return nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), nn.Linear(8, 2))
def groups(model):  # two groups in an order unlike the parameters', as the optimizer builder makes them
    params = list(model.parameters())
    return [{"params": params[1::2], "weight_decay": 0.0}, {"params": params[0::2], "weight_decay": 0.1}]
plain = build()
optimizer = torch.optim.AdamW(groups(plain), lr=0.1)
x = torch.randn(5, 4)
plain(x).square().mean().backward(); optimizer.step(); optimizer.zero_grad()
sharded = shard_model(copy.deepcopy(build()), torch.device("cpu"), 1, precision="fp32")
sharded_optimizer = torch.optim.AdamW(groups(sharded), lr=0.1)
# Copies, as a load from disk gives: at world size 1 a shard may share the full tensor's storage.
load_full_into_sharded(sharded, sharded_optimizer, copy.deepcopy(plain.state_dict()), copy.deepcopy(optimizer.state_dict()))
for model, opt in ((plain, optimizer), (sharded, sharded_optimizer)):
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
for (name, a), b in zip(plain.state_dict().items(), sharded.state_dict().values()):
    assert torch.equal(a, b.full_tensor()), name
print("equal")
"""


@pytest.mark.slow
def test_a_single_file_checkpoint_loads_into_a_sharded_model_and_optimizer(tmp_path):
    """DDP or one-process checkpoints resume under FSDP: torch's position-keyed optimizer
    state is mapped to parameter names through the param groups."""
    result = subprocess.run([sys.executable, "-c", FULL_INTO_SHARDED, str(tmp_path / "store")], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "equal" in result.stdout, result.stderr[-3000:]


def test_a_model_too_large_for_this_machine_gets_the_per_rank_verdict_without_being_built(tmp_path, monkeypatch):
    """preflight.only with preflight.memory.world_size: a model whose parameters would not
    fit this machine's RAM stays on the meta device (here: any model, by making the RAM
    share 0); the memory verdict runs, the checks that need weights skip and say why."""
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    monkeypatch.setattr(strategy_module, "HOST_SHARE", 0.0)
    cfg = tiny_config("preflight.only=true", "preflight.memory.target_gib=2", "preflight.memory.world_size=2",
                      "trainer.strategy=fsdp", "data.batch_size=4")
    recipe = CharLMRecipe(cfg, run_dir=tmp_path / "run")
    try:
        report = recipe.preflight()
    finally:
        recipe.close()
    assert all(p.is_meta for p in recipe.model.parameters())
    checks = {result.name: result for result in report.checks}
    vram = checks["memory.vram_headroom"]
    assert vram.status.value == "passed" and vram.data["per_rank"] and vram.data["world_size"] == 2
    for name in ("step.first_step", "memory.host_ram", "env.disk_space"):
        assert checks[name].status.value == "skipped" and "meta device" in checks[name].detail
    assert not [r.name for r in report.checks if r.status.value == "crashed"]
