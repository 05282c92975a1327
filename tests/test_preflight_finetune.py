"""Fine-tuning checks: what build_model loaded (O20), one LR for backbone and new head (O19),
LoRA wiring (O21, adapter_checks). Each defect is built the way users get it wrong; the healthy set stays quiet."""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.adapter_checks import AdapterCheck
from optimus_preflight.preflight.checks.finetune_checks import FinetuneLRCheck, LoadedWeightsCheck
from optimus_preflight.preflight.checks.model_checks import OptimizerParamsCheck
from optimus_preflight.training.load_report import loads_into, recording_loads
from tests.preflight_support import (
    CLASSES,
    FEATURES,
    assert_quiet,
    classification_data,
    codes,
    make_recipe,
    plain_context,
    run,
)

FINETUNE_CHECKS = (LoadedWeightsCheck, FinetuneLRCheck, AdapterCheck)
PRETRAINED_CLASSES = 10  # the checkpoint's head ("ImageNet's 1000")


class Net(nn.Module):
    """A backbone and a head registered last, as torchvision/HF classifiers are."""

    def __init__(self, classes: int = CLASSES, depth: int = 2):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(FEATURES, 32), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(32, 32), nn.ReLU()]
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return Net(PRETRAINED_CLASSES).state_dict()


def recorded(builder: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """The builder under recording_loads(), as TrainRecipe runs build_model (a plain loop
    wraps its own model construction the same way)."""

    def build() -> nn.Module:
        with recording_loads():
            return builder()

    return build


def results(recipe) -> dict:
    return run(recipe, *FINETUNE_CHECKS)


def issues(result, code: str, severity: str | None = None) -> list:
    return [i for i in result.issues if i.code == code and (severity is None or i.severity.value == severity)]


# ------------------------------------------------------------------------------ O20
def test_strict_false_load_of_a_ddp_checkpoint_is_an_error_naming_the_prefix(tmp_path, pretrained):
    source = Net(PRETRAINED_CLASSES)
    source.load_state_dict(pretrained)
    path = tmp_path / "ddp.pt"
    torch.save(nn.DataParallel(source).state_dict(), path)  # keys "module.backbone.0.weight", ...

    def build() -> nn.Module:
        model = Net(PRETRAINED_CLASSES)
        model.load_state_dict(torch.load(path), strict=False)  # "strict=False, it has the same layers"
        return model

    result = results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"]
    (issue,) = issues(result, "O20")
    assert issue.severity.value == "error"
    assert "'module.'" in issue.message and "0 of 6 tensors" in issue.message and "DDP" in issue.message
    assert "consume_prefix_in_state_dict_if_present(state_dict, 'module.')" in issue.fix
    # Loaded strictly, the same checkpoint raises; the recorder's note names the prefix there too.
    with recording_loads(), pytest.raises(RuntimeError, match="Missing key") as raised:
        Net(PRETRAINED_CLASSES).load_state_dict(torch.load(path))
    assert "'module.'" in raised.value.__notes__[0] and "consume_prefix" in raised.value.__notes__[0]

    # The fix works: stripped, the checkpoint loads completely and the check is quiet.
    def fixed() -> nn.Module:
        model = Net(PRETRAINED_CLASSES)
        state_dict = torch.load(path)
        consume_prefix_in_state_dict_if_present(state_dict, "module.")
        model.load_state_dict(state_dict, strict=False)
        return model

    for result in results(plain_context(tmp_path / "fixed", model=recorded(fixed))).values():
        assert_quiet(result)
        assert not result.issues


def test_a_model_prefix_the_checkpoint_lacks_is_named_too(tmp_path, pretrained):
    class Wrapper(nn.Module):  # e.g. a LightningModule holding the network as self.model
        def __init__(self):
            super().__init__()
            self.model = Net(PRETRAINED_CLASSES)

        def forward(self, x):
            return self.model(x)

    def build() -> nn.Module:
        wrapper = Wrapper()
        wrapper.load_state_dict(pretrained, strict=False)
        return wrapper

    (issue,) = issues(results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"], "O20")
    assert issue.severity.value == "error" and "the model's keys start with 'model.'" in issue.message
    assert "model.model.load_state_dict(state_dict)" in issue.fix


def test_strict_false_still_raises_on_a_replaced_head_and_the_note_says_what_to_drop(tmp_path, pretrained):
    # Verified on torch 2.13: strict=False relaxes presence, not shapes.
    with recording_loads(), pytest.raises(RuntimeError, match="size mismatch for head.weight") as raised:
        Net(CLASSES).load_state_dict(pretrained, strict=False)
    (note,) = raised.value.__notes__
    assert note.startswith("O20:") and "strict=False tolerates missing and unexpected keys" in note
    assert "head.weight" in note and "head.bias" in note and "k not in {'head.weight', 'head.bias'}" in note

    # The fix the note gives: drop the head's keys, load non-strict; the new head is reported as such.
    def build() -> nn.Module:
        model = Net(CLASSES)
        state_dict = {k: v for k, v in pretrained.items() if k not in {"head.weight", "head.bias"}}
        model.load_state_dict(state_dict, strict=False)
        return model

    checks = results(plain_context(tmp_path, model=recorded(build)))
    loaded = checks["model.loaded_weights"]
    assert_quiet(loaded)
    (info,) = issues(loaded, "O20", "info")
    assert "loaded 4 of 6 tensors" in info.message and "head.weight, head.bias" in info.message
    assert loaded.data["new_tensors"] == 2


def test_the_recorder_leaves_load_state_dict_as_it_was():
    original = nn.Module.load_state_dict
    with recording_loads():
        with recording_loads():  # nested (the recipe's hook around a builder that records itself)
            assert nn.Module.load_state_dict is not original
        assert nn.Module.load_state_dict is not original
    assert nn.Module.load_state_dict is original


def test_a_whole_training_checkpoint_passed_to_load_state_dict_is_an_error(tmp_path, pretrained):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": pretrained, "epoch": 3}, path)

    def build() -> nn.Module:
        model = Net(PRETRAINED_CLASSES)
        model.load_state_dict(torch.load(path), strict=False)
        return model

    (issue,) = issues(results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"], "O20")
    assert issue.severity.value == "error" and "'model'" in issue.message
    assert "checkpoint['model']" in issue.fix


def test_a_backbone_block_missing_from_the_checkpoint_is_a_warning(tmp_path, pretrained):
    def build() -> nn.Module:  # a deeper backbone than the checkpoint's: backbone.4 stays random
        model = Net(PRETRAINED_CLASSES, depth=3)
        model.load_state_dict(pretrained, strict=False)
        return model

    result = results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"]
    (issue,) = issues(result, "O20")
    assert issue.severity.value == "warning" and "backbone.4.weight, backbone.4.bias" in issue.message
    assert "not a new head" in issue.message


def test_checkpoint_keys_the_model_lacks_are_a_warning(tmp_path):
    torch.manual_seed(2)
    deeper = Net(PRETRAINED_CLASSES, depth=3).state_dict()

    def build() -> nn.Module:
        model = Net(PRETRAINED_CLASSES, depth=2)
        model.load_state_dict(deeper, strict=False)  # silently drops backbone.4, then loads head? shapes fit
        return model

    # backbone.4 exists only in the checkpoint: dropped.
    result = results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"]
    (issue,) = issues(result, "O20")
    assert issue.severity.value == "warning" and "matched no key of the model" in issue.message
    assert "backbone.4.weight" in issue.message


def test_a_checkpoint_of_another_model_is_an_error(tmp_path):
    other = nn.Sequential(nn.Linear(FEATURES, 32), nn.Linear(32, PRETRAINED_CLASSES)).state_dict()

    def build() -> nn.Module:
        model = Net(PRETRAINED_CLASSES)
        model.load_state_dict(other, strict=False)
        return model

    (issue,) = issues(results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"], "O20")
    assert issue.severity.value == "error" and "100% of the module's weights" in issue.message


def test_a_head_under_another_name_is_reported_as_new_without_a_warning(tmp_path, pretrained):
    class Renamed(Net):  # the old head's keys ("head.*") are dropped, the new "classifier" starts fresh
        def __init__(self):
            super().__init__()
            del self.head
            self.classifier = nn.Linear(32, CLASSES)

        def forward(self, x):
            return self.classifier(self.backbone(x))

    def build() -> nn.Module:
        model = Renamed()
        model.load_state_dict(pretrained, strict=False)
        return model

    result = results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"]
    assert_quiet(result)
    (info,) = issues(result, "O20")
    assert "classifier.weight" in info.message and "dropped from the checkpoint: head.weight" in info.message


def test_a_new_head_frozen_with_the_backbone_is_an_error(tmp_path, pretrained):
    def build() -> nn.Module:
        model = Net(PRETRAINED_CLASSES)
        model.load_state_dict(pretrained)
        model.head = nn.Linear(32, CLASSES)
        for p in model.parameters():  # "freeze everything, then unfreeze the top block"
            p.requires_grad = False
        for p in model.backbone[2].parameters():
            p.requires_grad = True
        return model

    result = results(plain_context(tmp_path, model=recorded(build)))["model.loaded_weights"]
    (issue,) = issues(result, "O20")
    assert issue.severity.value == "error" and "head.weight, head.bias" in issue.message
    assert "random initialisation for the whole run" in issue.message and "requires_grad=True" in issue.fix


# ------------------------------------------------------------------------------ O19
def replaced_head(pretrained: dict[str, torch.Tensor]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:  # the torchvision recipe: load, then put a new head in
        model = Net(PRETRAINED_CLASSES)
        model.load_state_dict(pretrained)
        model.head = nn.Linear(32, CLASSES)
        return model

    return recorded(build)


def test_one_lr_for_a_loaded_backbone_and_a_new_head_is_advised_against(tmp_path, pretrained):
    ctx = plain_context(tmp_path, model=replaced_head(pretrained))  # the default AdamW builder: one LR
    checks = results(ctx)
    assert_quiet(checks["model.loaded_weights"])  # the load itself was complete
    result = checks["model.finetune_lr"]
    assert_quiet(result)  # advice, not a warning
    (info,) = issues(result, "O19", "info")
    assert "head.weight, head.bias" in info.message and f"{ctx.cfg.optimizer.lr:g}" in info.message
    assert "lr / 10" in info.fix
    assert result.data["backbone_lrs"] == result.data["head_lrs"]


def test_o19_sees_a_head_a_loaded_backbone_was_wrapped_with(tmp_path, pretrained):
    class Classifier(nn.Module):
        def __init__(self, backbone: nn.Module):
            super().__init__()
            self.backbone, self.head = backbone, nn.Linear(32, CLASSES)

        def forward(self, x):
            return self.head(self.backbone(x))

    def build() -> nn.Module:
        backbone = Net(PRETRAINED_CLASSES).backbone
        backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in pretrained.items()
                                  if k.startswith("backbone.")})
        return Classifier(backbone)

    checks = results(plain_context(tmp_path, model=recorded(build)))
    assert_quiet(checks["model.loaded_weights"])
    assert not checks["model.loaded_weights"].issues  # the backbone loaded completely
    (info,) = issues(checks["model.finetune_lr"], "O19")
    assert "head.weight, head.bias" in info.message


@pytest.mark.parametrize("setup", ["discriminative", "frozen_backbone"])
def test_o19_is_quiet_with_per_group_lrs_or_a_frozen_backbone(tmp_path, pretrained, setup):
    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        if setup == "frozen_backbone":
            for p in model.backbone.parameters():
                p.requires_grad = False
            return torch.optim.AdamW(model.head.parameters(), lr=1e-3)
        return torch.optim.AdamW([{"params": model.head.parameters(), "lr": 1e-3},
                                  {"params": model.backbone.parameters(), "lr": 1e-4}])

    checks = results(plain_context(tmp_path, model=replaced_head(pretrained), optimizer=optimizer))
    assert not issues(checks["model.finetune_lr"], "O19")
    for result in checks.values():
        assert_quiet(result)


def test_the_checks_work_on_a_plain_loop_through_run_preflight(pretrained):
    model = replaced_head(pretrained)()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(classification_data(), batch_size=8, shuffle=True)
    report = run_preflight(model, optimizer, loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[check() for check in FINETUNE_CHECKS])
    found = {(issue.code, issue.severity.value) for result in report.checks for issue in result.issues}
    assert found == {("O19", "info")}
    assert len(loads_into(model)) == 1


# ------------------------------------------------------------------------------ O21
class LoRALinear(nn.Module):
    """A hand-written LoRA layer, named as PEFT names it: base_layer, lora_A, lora_B."""

    def __init__(self, base: nn.Linear, rank: int = 2, alpha: float = 4.0):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


class Block(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        attention = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / 32**0.5, dim=-1) @ self.v(h)
        x = x + self.o(attention)
        return x + self.down(torch.relu(self.up(x)))


class TinyTransformer(nn.Module):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.embed = nn.Linear(FEATURES, 32)
        self.blocks = nn.Sequential(Block(), Block())
        self.classifier = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(self.embed(x).unsqueeze(1)).mean(1))


def inject_lora(model: nn.Module, targets: tuple[str, ...]) -> int:
    """Wrap every Linear whose attribute name is in ``targets`` (PEFT's suffix match)."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child))
                replaced += 1
    return replaced


def lora_model(targets=("q", "v"), *, freeze_base=True, train_head=True, freeze_after=False) -> nn.Module:
    torch.manual_seed(0)
    model = TinyTransformer()
    if freeze_base:
        model.requires_grad_(False)
    inject_lora(model, targets)
    if freeze_after:  # freezing after the injection freezes the adapters too
        model.requires_grad_(False)
    if train_head:
        model.classifier.requires_grad_(True)
    return model


def trainable_adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def adapter_result(tmp_path: Path, builder, *overrides: str):
    ctx = plain_context(tmp_path, *overrides, model=builder, optimizer=trainable_adamw)
    return results(ctx)["model.adapters"]


def test_healthy_lora_is_quiet(tmp_path):
    result = adapter_result(tmp_path, lora_model, "+model.lora_rank=2")
    assert_quiet(result)
    assert not result.issues and result.data["adapter_tensors"] == 8


def test_lora_target_names_that_match_nothing_are_an_error_listing_the_real_names(tmp_path):
    # Llama's names on a model whose projections are q/k/v/o: no layer is wrapped.
    builder = lambda: lora_model(targets=("q_proj", "v_proj"))  # noqa: E731
    assert inject_lora(TinyTransformer(), ("q_proj", "v_proj")) == 0
    result = adapter_result(tmp_path, builder, "+model.lora_rank=2")
    (issue,) = issues(result, "O21")
    assert issue.severity.value == "error" and "model.lora_rank=2" in issue.message
    assert "classifier.weight" in issue.message  # only the head trains
    assert "q, k, v, o, up, down" in issue.fix
    # Without any sign that LoRA was meant, a frozen base with a trainable head is linear probing: quiet.
    assert_quiet(adapter_result(tmp_path / "probe", builder))


def test_frozen_adapters_are_an_error(tmp_path):
    result = adapter_result(tmp_path, lambda: lora_model(freeze_after=True))
    (issue,) = issues(result, "O21")
    assert issue.severity.value == "error" and "all 8 of the 8 LoRA adapter tensors are frozen" in issue.message


def test_adapters_on_an_unfrozen_base_are_a_warning(tmp_path):
    result = adapter_result(tmp_path, lambda: lora_model(freeze_base=False))
    (issue,) = issues(result, "O21")
    assert issue.severity.value == "warning" and "adapter-wrapped layer(s)" in issue.message
    assert "base_layer.weight" in issue.message and "'lora_' in name" in issue.fix


class LoraAB(nn.Module):
    """A hand-written LoRA layer with its own A/B parameters (no lora_ in the names)."""

    def __init__(self, base: nn.Linear, rank: int = 2):
        super().__init__()
        self.weight, self.bias = base.weight, base.bias
        self.A = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias) + x @ self.A.t() @ self.B.t()


def ab_model(freeze_base: bool = True) -> nn.Module:
    model = TinyTransformer()
    if freeze_base:
        model.requires_grad_(False)
    for block in model.blocks:
        block.q, block.v = LoraAB(block.q), LoraAB(block.v)
    model.classifier.requires_grad_(True)
    return model


def test_adapters_named_by_their_lora_class_count_as_adapters(tmp_path):
    healthy = adapter_result(tmp_path, ab_model, "+model.lora_rank=2")
    assert_quiet(healthy)
    assert not healthy.issues and healthy.data["adapter_tensors"] == 8
    (issue,) = issues(adapter_result(tmp_path / "unfrozen", lambda: ab_model(freeze_base=False)), "O21")
    assert issue.severity.value == "warning" and "blocks.0.q.weight" in issue.message
    # The fix's code keeps these adapters (named A and B) trainable.
    model = ab_model(freeze_base=False)
    snippet = issue.fix.split("after: ", 1)[1].split(" (then", 1)[0]
    exec(snippet.replace(", then ", "\n"), {"model": model})
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        f"blocks.{i}.{layer}.{ab}" for i in range(2) for layer in "qv" for ab in "AB"}


def test_adapters_built_after_the_optimizer_are_reported_by_o2(tmp_path):
    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for n, p in model.named_parameters() if "lora_" not in n and p.requires_grad])

    ctx = plain_context(tmp_path, model=lora_model, optimizer=optimizer)
    result = run(ctx, OptimizerParamsCheck)["model.optimizer_params"]
    assert "O2" in codes(result) and "lora_A" in result.issues[0].message


def test_a_new_head_frozen_with_the_base_under_lora_is_an_error(tmp_path, pretrained):
    def build() -> nn.Module:
        model = TinyTransformer(classes=PRETRAINED_CLASSES)
        with torch.no_grad():
            checkpoint = {k: torch.randn_like(v) for k, v in model.state_dict().items() if not k.startswith("classifier")}
        model.classifier = nn.Linear(32, CLASSES)
        model.load_state_dict(checkpoint, strict=False)  # the backbone; the new classifier is missing
        model.requires_grad_(False)
        inject_lora(model, ("q", "v"))  # only the adapters train: the classifier stays random
        return model

    result = adapter_result(tmp_path, recorded(build))
    (issue,) = issues(result, "O21")
    assert issue.severity.value == "error" and "classifier.weight, classifier.bias" in issue.message
    assert "modules_to_save" in issue.fix


def test_a_trained_head_left_out_of_the_state_dict_is_an_error(tmp_path):
    def build() -> nn.Module:
        model = lora_model()

        def adapters_only(module, state_dict, prefix, local_metadata):  # "save just the adapters"
            for key in [k for k in state_dict if "lora_" not in k]:
                del state_dict[key]

        model._register_state_dict_hook(adapters_only)
        return model

    result = adapter_result(tmp_path, build)
    (issue,) = issues(result, "O21")
    assert issue.severity.value == "error" and "not in model.state_dict()" in issue.message
    assert "classifier.weight" in issue.message


def peft_like(modules_to_save: bool) -> nn.Module:
    """PEFT's naming and peft_config (peft is not installed here): with modules_to_save the
    trained head is a copy under ``classifier.modules_to_save.default``."""
    model = lora_model(train_head=not modules_to_save)
    if modules_to_save:
        original = model.classifier
        wrapper = nn.Module()
        wrapper.original_module = original
        wrapper.modules_to_save = nn.ModuleDict({"default": nn.Linear(32, CLASSES)})
        wrapper.forward = lambda x: wrapper.modules_to_save["default"](x)
        model.classifier = wrapper
    model.peft_config = {"default": types.SimpleNamespace(target_modules={"q", "v", "query"}, bias="none")}
    return model


def test_a_peft_head_outside_modules_to_save_is_a_warning(tmp_path):
    result = adapter_result(tmp_path, lambda: peft_like(modules_to_save=False))
    warning = issues(result, "O21", "warning")
    assert len(warning) == 1 and "save_pretrained()" in warning[0].message
    assert "classifier.weight" in warning[0].message and "modules_to_save" in warning[0].fix
    (info,) = issues(result, "O21", "info")
    assert "query" in info.message  # a target of another architecture, beside ones that matched


def test_a_peft_head_in_modules_to_save_is_quiet(tmp_path):
    assert_quiet(adapter_result(tmp_path, lambda: peft_like(modules_to_save=True)))


# ------------------------------------------------------------------------- healthy set
def cnn() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (1, FEATURES)), nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * FEATURES, CLASSES))


@pytest.mark.parametrize("model", [None, cnn], ids=["mlp", "cnn"])
def test_quiet_on_plain_classifiers(tmp_path, model):
    for result in results(plain_context(tmp_path, model=model)).values():
        assert_quiet(result)
        assert not result.issues


def test_quiet_on_the_default_char_lm_recipe(tmp_path):
    for result in results(make_recipe(tmp_path, classification=False)).values():
        assert_quiet(result)
        assert not result.issues


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_quiet_on_hugging_face_models(family):
    transformers = pytest.importorskip("transformers")
    configs = {
        "gpt2": lambda: transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32),
        "llama": lambda: transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                                  intermediate_size=32, vocab_size=64),
        "bert": lambda: transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                                intermediate_size=32, vocab_size=64),
    }
    model_class = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
                   "bert": transformers.BertForSequenceClassification}[family]
    with recording_loads():
        model = model_class(configs[family]())
    # Reloading its own weights (a resume-like full load) is quiet too; so is a checkpoint that
    # stores tied weights once (safetensors drops GPT-2's lm_head.weight, the same tensor as wte).
    state_dict = model.state_dict()
    if family == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight
        del state_dict["lm_head.weight"]
    with recording_loads():
        result = model.load_state_dict(state_dict, strict=False)
    assert result.missing_keys == (["lm_head.weight"] if family == "gpt2" else [])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 64, (16, 8))
    batches = [{"input_ids": ids[i:i + 4], "labels": (ids[i:i + 4] if family != "bert" else ids[i:i + 4, 0] % 2)}
               for i in range(0, 16, 4)]
    report = run_preflight(model, optimizer, batches, checks=[check() for check in FINETUNE_CHECKS])
    for result in report.checks:
        assert_quiet(result)
        assert not result.issues, [i.message for i in result.issues]


@pytest.mark.parametrize("head_key", ["classifier", "head"])
def test_a_param_group_whose_name_filter_matched_nothing_is_named(head_key):
    from optimus_preflight.preflight.checks.model_checks import OptimizerParamsCheck

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.encoder(x))

    model = Net()
    groups = [{"params": [p for n, p in model.named_parameters() if head_key not in n], "lr": 1e-5},
              {"params": [p for n, p in model.named_parameters() if head_key in n], "lr": 2e-3}]
    x = torch.randn(64, 8)
    report = run_preflight(model, torch.optim.AdamW(groups), torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x[:, :3].argmax(1)), batch_size=16), loss_fn=nn.CrossEntropyLoss(),
        checks=[OptimizerParamsCheck()])
    found = [i for i in report.check("model.optimizer_params").issues if i.code == "EMPTY_PARAM_GROUP"]
    if head_key == "classifier":
        assert len(found) == 1 and "empty group" in found[0].message and "'head' is in group 0 (lr=1e-05)" in found[0].message
    else:
        assert not found
