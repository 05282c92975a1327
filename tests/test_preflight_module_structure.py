"""model.structure: one module object listed several times in a ModuleList/Sequential
([block] * n), and BatchNorm momentum of 0 or in Keras' convention; distinct layers, a
module shared by calling it in a loop, and torch's default momentum stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.module_structure import ModuleStructureCheck


class Stack(nn.Module):
    def __init__(self, build: str, momentum: float | None = 0.1):
        super().__init__()
        block = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        if build == "repeated":
            self.blocks = nn.ModuleList([block] * 4)
        elif build == "shared_in_loop":
            self.blocks = nn.ModuleList([block])
        else:
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4)])
        self.loops = 4 if build == "shared_in_loop" else 1
        self.norm, self.head = nn.BatchNorm1d(16, momentum=momentum), nn.Linear(16, 3)

    def forward(self, x):
        for _ in range(self.loops):
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x))


def codes(model: nn.Module) -> list[str]:
    x, y = torch.randn(256, 16), torch.randint(0, 3, (256,))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    return [i.code for i in report.check("model.structure").issues]


def test_a_block_listed_four_times_is_one_block():
    assert codes(Stack("repeated")) == ["MODULE_REPEATED"]


@pytest.mark.parametrize("build", ["distinct", "shared_in_loop"])
def test_distinct_layers_and_a_module_called_in_a_loop_are_quiet(build):
    assert codes(Stack(build)) == []


@pytest.mark.parametrize("momentum, fires", [(0.0, True), (0.99, True), (0.1, False), (None, False), (0.01, False)])
def test_batchnorm_momentum(momentum, fires):
    assert codes(Stack("distinct", momentum)) == (["BN_MOMENTUM"] if fires else [])


@pytest.mark.parametrize("loaded, fires", [(False, True), (True, False)], ids=["nothing_loaded", "checkpoint_loaded"])
def test_a_frozen_backbone_still_at_its_initial_weights(loaded, fires):
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    if loaded:  # a pretrained checkpoint: weights that left the init's uniform box
        pretrained = {k: v + 0.05 * torch.randn_like(v) for k, v in backbone.state_dict().items()}
        backbone.load_state_dict(pretrained)
    else:  # the DataParallel checkpoint's 'module.' keys match nothing under strict=False
        backbone.load_state_dict({"module." + k: v for k, v in backbone.state_dict().items()}, strict=False)
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(64, 3))
    x, y = torch.randn(256, 16), torch.randint(0, 3, (256,))
    report = run_preflight(model, torch.optim.Adam(model[1].parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    found = [i for i in report.check("model.structure").issues if i.code == "FROZEN_AT_INIT"]
    assert bool(found) == fires
    if found:  # a note: the same state is a frozen backbone built from a config on purpose
        assert found[0].severity.name == "INFO" and "strict=False" in found[0].message


@pytest.mark.parametrize("activation", ["positional_true", "named_inplace"])
def test_leaky_relu_given_true_as_its_slope_is_the_identity(activation):
    act = nn.LeakyReLU(True) if activation == "positional_true" else nn.LeakyReLU(negative_slope=0.01, inplace=True)
    model = nn.Sequential(nn.Linear(16, 32), act, nn.Linear(32, 3))
    found = codes(model)
    assert ("ACTIVATION_LINEAR" in found) == (activation == "positional_true")


@pytest.mark.parametrize("tied", [True, False])
def test_freezing_a_transformer_tied_to_its_lm_head_freezes_the_head(tied):
    transformers = pytest.importorskip("transformers")
    from optimus_preflight.preflight.checks.model_checks import OptimizerParamsCheck

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     tie_word_embeddings=tied)
    model = transformers.GPT2LMHeadModel(config)
    model.transformer.requires_grad_(False)  # probe with the LM head (and ln_f) only
    optimizer = torch.optim.AdamW([*model.lm_head.parameters(), *model.transformer.ln_f.parameters()], 1e-3)
    ids = torch.randint(0, 64, (64, 16))
    loader = DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=8)
    report = run_preflight(model, optimizer, loader, checks=[FirstBatchCheck(), OptimizerParamsCheck()])
    issues = [i for i in report.check("model.optimizer_params").issues if i.code == "O17"]
    assert len(issues) == 1  # ln_f is frozen with the transformer either way
    assert ("lm_head.weight" in issues[0].message and "tied" in issues[0].message) == tied


@pytest.mark.parametrize("selector, pretrained, expected", [
    ("hasattr", False, ["ONLY_BIASES_TRAIN"]),   # every Linear has .weight: all matrices frozen at their init
    ("hasattr", True, []),                        # BitFit: biases tuned on loaded weights
    ("isinstance", False, []),                    # only the BatchNorm scales frozen, as meant
], ids=["freeze_helper_catches_every_layer", "bias_only_fine_tune", "batchnorm_only"])
def test_only_biases_training_on_random_weights(selector, pretrained, expected):
    torch.manual_seed(0)
    model = Stack("distinct")
    if pretrained:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0, 0.3)  # loaded weights leave the default init's box
    for module in model.modules():
        chosen = hasattr(module, "weight") if selector == "hasattr" else isinstance(module, nn.BatchNorm1d)
        if chosen and getattr(module, "weight", None) is not None:
            module.weight.requires_grad_(False)
    assert [code for code in codes(model) if code in ("ONLY_BIASES_TRAIN", "FROZEN_AT_INIT")] == expected


class TicketGru(nn.Module):
    def __init__(self, freeze_encoder: bool, loaded: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.gru, self.head = nn.Embedding(300, 16), nn.GRU(16, 32, batch_first=True), nn.Linear(32, 3)
        if loaded:
            with torch.no_grad():  # weights of a pretrained encoder leave the default init's distributions
                self.emb.weight.mul_(0.3).add_(0.1)
                for weight in self.gru.parameters():
                    weight.normal_(0, 0.4)
        if freeze_encoder:
            self.emb.requires_grad_(False)
            self.gru.requires_grad_(False)

    def forward(self, ids):
        return self.head(self.gru(self.emb(ids))[1][-1])


@pytest.mark.parametrize("freeze, loaded, fires", [(True, False, True), (True, True, False), (False, False, False)],
                         ids=["frozen_random_encoder", "frozen_loaded_encoder", "trained_encoder"])
def test_a_frozen_embedding_and_gru_still_at_their_init(freeze, loaded, fires):
    model = TicketGru(freeze, loaded)
    ids, y = torch.randint(0, 300, (256, 12)), torch.randint(0, 3, (256,))
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(TensorDataset(ids, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    found = [i for i in report.check("model.structure").issues if i.code == "FROZEN_AT_INIT"]
    assert bool(found) == fires
    if found:
        assert "emb, gru" in found[0].message and "type=bool" in found[0].message


def test_a_frozen_pretrained_table_drawn_normal_alone_is_quiet():
    torch.manual_seed(0)
    vectors = torch.randn(300, 16)  # synthetic 'pretrained' text vectors, N(0, 1)
    model = nn.Sequential(nn.Embedding.from_pretrained(vectors, freeze=True), nn.Flatten(), nn.Linear(12 * 16, 3))
    ids, y = torch.randint(0, 300, (256, 12)), torch.randint(0, 3, (256,))
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(TensorDataset(ids, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    assert [i.code for i in report.check("model.structure").issues] == []


def structure_issues(model: nn.Module, parameters=None) -> list:
    x, y = torch.randn(256, 16), torch.randint(0, 3, (256,))
    trainable = [p for p in (parameters if parameters is not None else model.parameters()) if p.requires_grad]
    report = run_preflight(model, torch.optim.Adam(trainable, 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    return report.check("model.structure").issues


def test_one_small_frozen_layer_at_init_is_not_a_backbone_nothing_was_loaded_into():
    """A stem loaded from weights that were themselves a fresh init looks like the init; one
    layer is not enough to say nothing was loaded."""
    torch.manual_seed(0)
    stem = nn.Linear(16, 32)
    stem.load_state_dict(nn.Linear(16, 32).state_dict())
    stem.requires_grad_(False)
    model = nn.Sequential(stem, nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    assert [i.code for i in structure_issues(model)] == []


class MeanTeacher(nn.Module):
    def __init__(self, alias: bool):
        super().__init__()
        import copy

        torch.manual_seed(1)
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 3)
        self.teacher = [self.encoder if alias else copy.deepcopy(self.encoder)]  # kept out of the parameters
        self.teacher[0].requires_grad_(False)

    def forward(self, x):
        return self.head(self.encoder(x))


@pytest.mark.parametrize("alias", [True, False], ids=["alias", "deepcopy"])
def test_a_teacher_that_is_the_students_encoder_itself(alias):
    found = structure_issues(MeanTeacher(alias))
    assert [i.code for i in found] == (["FROZEN_AT_INIT"] if alias else [])
    if found:
        assert "'encoder' is the same module object as 'teacher[0]'" in found[0].message
        assert "copy.deepcopy" in found[0].fix


def test_a_parameter_slice_that_freezes_the_heads_weight_names_the_slice():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    for p in list(model.parameters())[:-1]:
        p.requires_grad_(False)
    found = structure_issues(model)
    assert [i.code for i in found] == ["ONLY_BIASES_TRAIN"] and "[:-1]" in found[0].message


class Positions(nn.Module):
    def __init__(self, learn: bool):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(1, 16), requires_grad=learn)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(x + self.pos)


@pytest.mark.parametrize("learn", [False, True])
def test_a_position_table_frozen_at_zero(learn):
    found = structure_issues(Positions(learn))
    assert [i.code for i in found] == ([] if learn else ["FROZEN_AT_ZERO"])


@pytest.mark.parametrize("init", ["uniform_default", "uniform_bounded", "default"])
def test_weights_initialised_from_uniform_0_1(init):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    for layer in (model[0], model[2], model[4]):
        if init == "uniform_default":
            nn.init.uniform_(layer.weight)
        elif init == "uniform_bounded":
            nn.init.uniform_(layer.weight, -layer.in_features ** -0.5, layer.in_features ** -0.5)
    found = structure_issues(model)
    assert [i.code for i in found] == (["INIT_ALL_POSITIVE"] if init == "uniform_default" else [])
    if found:
        assert "U(0, 1)" in found[0].message and "uniform_(w, -bound, bound)" in found[0].fix


@pytest.mark.parametrize("keep", [("head", "LayerNorm"), ("classifier", "LayerNorm")], ids=["timm_names", "hf_names"])
def test_a_freeze_by_name_that_misses_a_hugging_face_head(keep):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=3))
    for name, p in model.named_parameters():
        p.requires_grad = any(k in name for k in keep)  # the names of another library's models
    ids = torch.randint(0, 60, (64, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": torch.tensor(int(row[0]) % 3)} for row in ids]
    report = run_preflight(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(data, batch_size=16), checks=[FirstBatchCheck(), ModuleStructureCheck()])
    found = [i for i in report.check("model.structure").issues if i.severity.value != "info"]
    if keep[0] == "head":
        assert [i.code for i in found] == ["ONLY_BIASES_TRAIN"]
        assert "'classifier' is frozen too" in found[0].message and "model.classifier" in found[0].fix
    else:
        assert found == []


@pytest.mark.parametrize("how", ["attribute", "requires_grad_"])
def test_unfreezing_top_layers_with_a_module_attribute_leaves_them_frozen(how):
    from optimus_preflight.preflight.checks.module_structure import requires_grad_attributes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    for p in model.parameters():
        p.requires_grad = False
    for layer in (model[2], model[4]):
        if how == "attribute":
            layer.requires_grad = True  # a plain attribute: the parameters stay frozen
        else:
            layer.requires_grad_(True)
    found = requires_grad_attributes(model)
    assert [name for name, _, _ in found] == (["2", "4"] if how == "attribute" else [])
    if how == "attribute":
        assert found[0] == ("2", True, 2)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters()], 1e-3), DataLoader(data, batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(), checks=[ModuleStructureCheck()])
    issues = [i for i in report.check("model.structure").issues if i.code == "REQUIRES_GRAD_ON_MODULE"]
    assert bool(issues) == (how == "attribute")
    if issues:
        assert "'2', '4'" in issues[0].message and "module.requires_grad_(True)" in issues[0].fix


class PointLayer(nn.Module):
    """A hand-written layer keeping its weight as a buffer (so that .to() moves it) or as a parameter."""

    def __init__(self, fan_in: int, fan_out: int, as_buffer: bool):
        super().__init__()
        weight = torch.randn(fan_in, fan_out) / fan_in ** 0.5
        if as_buffer:
            self.register_buffer("weight", weight)
        else:
            self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(fan_out))

    def forward(self, x):
        return x @ self.weight + self.bias


@pytest.mark.parametrize("as_buffer", [True, False])
def test_weights_registered_as_buffers_leave_only_the_biases_to_train(as_buffer):
    model = nn.Sequential(PointLayer(16, 32, as_buffer), nn.ReLU(), PointLayer(32, 3, as_buffer))
    issues = [i for i in structure_issues(model) if i.code == "ONLY_BIASES_TRAIN"]
    assert bool(issues) == as_buffer
    if issues:
        assert "0.weight (16, 32)" in issues[0].message and "register_buffer" in issues[0].message
        assert "nn.Parameter" in issues[0].fix


def test_a_fixed_filterbank_buffer_before_a_trained_head_is_quiet():
    class Filterbank(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bank", torch.rand(16, 8))  # fixed on purpose (a mel filterbank)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x @ self.bank)

    assert not [i for i in structure_issues(Filterbank()) if i.code == "ONLY_BIASES_TRAIN"]


@pytest.mark.parametrize("retarget", ["attribute", "new_layer"])
def test_a_head_resized_by_its_out_features_attribute_is_named(retarget):
    from optimus_preflight.preflight.checks.module_structure import ModuleStructureCheck, size_attributes_changed

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 40))
    if retarget == "attribute":
        model[2].out_features = 4  # "change the number of classes"
    else:
        model[2] = nn.Linear(32, 4)
    x = torch.randn(64, 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :4].argmax(1)), batch_size=16)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader,
                           loss_fn=nn.CrossEntropyLoss(), checks=[ModuleStructureCheck()])
    found = [i for i in report.check("model.structure").issues if i.code == "SIZE_ATTRIBUTE_CHANGED"]
    if retarget == "attribute":
        assert len(found) == 1 and "2.out_features is 4" in found[0].message and "40 logits" in found[0].message
        assert "nn.Linear(32, 4)" in found[0].fix
    else:
        assert not found and size_attributes_changed(model) == []


@pytest.mark.parametrize("keep", ["fc", "classifier"])
def test_a_random_head_frozen_by_a_name_filter_is_named(keep):
    class Spotter(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Linear(32, 48), nn.ReLU())
            self.gate = nn.ModuleDict({"fc1": nn.Linear(48, 12), "fc2": nn.Linear(12, 48)})
            self.classifier = nn.Linear(48, 16)

        def forward(self, x):
            h = self.features(x)
            h = h * torch.sigmoid(self.gate["fc2"](torch.relu(self.gate["fc1"](h))))
            return self.classifier(h)

    torch.manual_seed(0)
    model = Spotter()
    with torch.no_grad():  # a "pretrained" front end and gate: not PyTorch's init
        for layer in (model.features[0], model.gate["fc1"], model.gate["fc2"]):
            layer.weight.normal_(0, 0.5)
    for name, p in model.named_parameters():
        if keep not in name:
            p.requires_grad = False
    x = torch.randn(64, 32)
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3),
                           DataLoader(TensorDataset(x, x[:, :16].argmax(1)), batch_size=16),
                           loss_fn=nn.CrossEntropyLoss(), checks=[ModuleStructureCheck()])
    found = [i for i in report.check("model.structure").issues if i.code == "FROZEN_AT_INIT"]
    if keep == "fc":
        assert len(found) == 1 and "output layer 'classifier' is frozen" in found[0].message
        assert "model.classifier.requires_grad_(True)" in found[0].fix
    else:
        assert not found


class LoRALinear(nn.Module):
    """A frozen base Linear plus a low-rank update named down / up (up starts at zero)."""

    def __init__(self, features: int, rank: int = 4):
        super().__init__()
        self.base = nn.Linear(features, features)
        self.down, self.up = nn.Linear(features, rank, bias=False), nn.Linear(rank, features, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


@pytest.mark.parametrize("keyword", ["lora", "down"], ids=["filter_matches_no_adapter", "filter_matches_adapters"])
def test_adapters_a_name_filter_missed_are_named_as_frozen_adapters(keyword):
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(16), nn.LayerNorm(16), nn.ReLU(), LoRALinear(16), nn.LayerNorm(16))
    for name, p in model.named_parameters():
        p.requires_grad = keyword in name or "1." in name or "4." in name  # adapters and the norms train
    found = [i for i in structure_issues(model) if i.code == "ONLY_BIASES_TRAIN"]
    if keyword == "lora":
        assert found and "adapters stay frozen" in found[0].message and "'0.up.weight' holds only zeros" in found[0].message
    else:
        assert not found
