"""Set g, family `what_is_trained`: which parameters really learn (registration, init, freezing, gradients)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_g.registry import accuracy, case, fix, loader, seed, val_acc

# --------------------------------------------------------------------------- 1: heads built by list multiplication


def vehicle_sensors(n=4000, d=16, tasks=3, classes=4, s=0):
    """Sensor summaries; three independent attributes (body type, fuel, drive) each a 4-way label."""
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    ys = [(x @ torch.randn(d, classes, generator=g)).argmax(1) for _ in range(tasks)]
    return x, torch.stack(ys, 1)


class VehicleMultiTask(nn.Module):
    def __init__(self, d=16, tasks=3, classes=4, separate=False):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        if separate:
            self.heads = nn.ModuleList([nn.Linear(64, classes) for _ in range(tasks)])
        else:
            self.heads = nn.ModuleList([nn.Linear(64, classes)] * tasks)

    def forward(self, x):
        h = self.trunk(x)
        return torch.stack([head(h) for head in self.heads], 1)     # (B, tasks, classes)


def multitask_ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).transpose(1, 2), y)


def mean_task_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: (m(b[0]).argmax(-1), b[1]))


def _vehicle(fix=False):
    seed(0)
    x, y = vehicle_sensors(s=21)
    model = VehicleMultiTask(separate=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=multitask_ce, max_steps=2000)


@case("vehicle_multitask_heads_built_by_list_multiplication", "what_is_trained",
      bug="the three task heads are nn.ModuleList([nn.Linear(64, 4)] * 3): list multiplication repeats a reference "
          "to ONE Linear, so body type, fuel and drive share a single head (one set of weights, registered once) and "
          "produce identical logits for three unrelated labels ([nn.Linear(64, 4) for _ in range(3)] is the fix)",
      cause_pattern=r"(same|one|single|shared) (module|layer|object|instance|head|linear|weights)[^.]*(three|3|all|"
                    r"every|each|repeated|times|tasks)|\]\s*\*\s*\d|list multiplication|(heads?|layers?)[^.]*(alias|"
                    r"share (the same|one|a single)|same (object|instance|module|weights?|parameters?)|identical "
                    r"(weights|parameters|logits|outputs))|(references|copies) (to|of) (the same|one|a single)")
def vehicle_multitask_heads_built_by_list_multiplication():
    return _vehicle()


def _fact_vehicle():
    m = VehicleMultiTask()
    print(f"  heads[0] is heads[2]: {m.heads[0] is m.heads[2]}; head parameters registered: "
          f"{sum(p.numel() for p in m.heads.parameters())} (one 64x4 Linear)")


fix("vehicle_multitask_heads_built_by_list_multiplication", lambda: _vehicle(True), mean_task_acc,
    "val acc over the 3 tasks", _fact_vehicle)

# --------------------------------------------------------------------------- 2: Embedding(max_norm=0.0)

KEYWORDS = {0: (3, 4, 5), 1: (6, 7, 8), 2: (9, 10, 11)}


def support_messages(n=3000, length=12, vocab=80, s=0):
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(12, vocab, (n, length), generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    for i in range(n):
        pos = torch.randperm(length, generator=g)[:2]
        ids[i, pos] = torch.tensor(KEYWORDS[int(y[i])])[torch.randint(0, 3, (2,), generator=g)]
    return ids, y


CONFIG = {"vocab": 80, "dim": 32, "max_norm": 0.0}      # 0.0 = 'no constraint' in the old Keras-style config


class MessageClassifier(nn.Module):
    def __init__(self, cfg=CONFIG):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab"], cfg["dim"], max_norm=cfg["max_norm"])
        self.mlp = nn.Sequential(nn.Linear(cfg["dim"], 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, ids):
        return self.mlp(self.emb(ids).mean(1))


def _messages(fix=False):
    seed(0)
    ids, y = support_messages(s=22)
    model = MessageClassifier({**CONFIG, "max_norm": None} if fix else CONFIG)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(ids[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("support_messages_embedding_max_norm_zero", "what_is_trained",
      bug="the config's max_norm: 0.0 (meant as 'no constraint') is passed to nn.Embedding(max_norm=0.0): every row "
          "that is looked up is renormalised in place to norm 0 on each forward, so all token vectors are zero, the "
          "classifier sees the same input for every message and the embedding's updates are wiped at the next "
          "lookup (max_norm=None)",
      cause_pattern=r"max_norm|renorm\w*|(embedding|rows?|vectors?|weights?)s?[^.]*(norm|length)s?[^.]*(zero|0\.0|"
                    r"tiny|1e-0?7)|(embedding|rows?|vectors?)[^.]*(rescaled|renormali[sz]ed|shrunk|clipped|reset) to|"
                    r"(embedding|rows?|vectors?)s? (are |is )?(all )?zeros?\b")
def support_messages_embedding_max_norm_zero():
    return _messages()


def _fact_messages():
    m = MessageClassifier()
    out = m.emb(torch.tensor([[5, 20, 40]]))
    print(f"  embedding output norm after lookup: {out.norm():.2e}; stored rows 5/20/40 norm "
          f"{m.emb.weight[[5, 20, 40]].norm():.2e}")


fix("support_messages_embedding_max_norm_zero", lambda: _messages(True), val_acc, "val acc", _fact_messages)

# --------------------------------------------------------------------------- 3: gradient hook mask zeroes every row

N_ITEMS, N_PRETRAINED = 400, 100


def catalog_baskets(n=4000, s=0):
    """Items 0-99 have pretrained vectors; 100-399 are new items. A basket's category follows its items."""
    g = torch.Generator().manual_seed(s)
    item_cat = torch.randint(0, 4, (N_ITEMS,), generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    baskets = torch.zeros(n, 5, dtype=torch.long)
    for c in range(4):
        pool = (item_cat == c).nonzero().squeeze(1)
        rows = (y == c).nonzero().squeeze(1)
        baskets[rows] = pool[torch.randint(0, len(pool), (len(rows), 5), generator=g)]
    pretrained = torch.randn(N_PRETRAINED, 16, generator=g) * 0.3
    pretrained[:, :4] += F.one_hot(item_cat[:N_PRETRAINED], 4) * 2.0
    return baskets, y, pretrained


class BasketClassifier(nn.Module):
    def __init__(self, pretrained, keep_ones=False):
        super().__init__()
        self.items = nn.Embedding(N_ITEMS, 16)
        with torch.no_grad():
            self.items.weight[:N_PRETRAINED] = pretrained
        keep = torch.ones(N_ITEMS, 1) if keep_ones else torch.zeros(N_ITEMS, 1)
        keep[:N_PRETRAINED] = 0.0                        # freeze the pretrained rows, train the new ones
        self.register_buffer("keep", keep)
        self.items.weight.register_hook(lambda grad: grad * self.keep)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, baskets):
        return self.head(self.items(baskets).mean(1))


def _catalog(fix=False):
    seed(0)
    baskets, y, pretrained = catalog_baskets(s=23)
    model = BasketClassifier(pretrained, keep_ones=fix)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(baskets[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(baskets[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("catalog_embedding_partial_freeze_hook_zeroes_all_rows", "what_is_trained",
      bug="to freeze only the 100 pretrained item vectors, a gradient hook multiplies the embedding's gradient by a "
          "mask built as torch.zeros(N_ITEMS, 1) with mask[:100] = 0: the mask is zero everywhere, so the 300 new "
          "items' rows receive exactly zero gradient and stay at their random init; baskets of new items cannot be "
          "classified (start the mask from torch.ones)",
      cause_pattern=r"\bhook|(gradient|grad)s?[^.]*(mask|multipl|zeroed|all zeros?|exactly zero)|(embedding|weight|"
                    r"rows?|items?)[^.]*(zero|no) grad|(new|all|every|300) (rows|items|ids|vectors)[^.]*(frozen|never "
                    r"(updated|trained|change|move))|torch\.(zeros|ones)")
def catalog_embedding_partial_freeze_hook_zeroes_all_rows():
    return _catalog()


def _fact_catalog():
    kw = _catalog()
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(m(x), y).backward()
    print(f"  embedding gradient rows that are non-zero: {(m.items.weight.grad.abs().sum(1) > 0).sum().item()} "
          f"of {N_ITEMS}")


fix("catalog_embedding_partial_freeze_hook_zeroes_all_rows", lambda: _catalog(True), val_acc, "val acc",
    _fact_catalog)

# --------------------------------------------------------------------------- 4: BERT read from hidden_states[0]


def intent_utterances(n=2000, length=14, vocab=120, s=0):
    """[CLS]=2, [SEP]=3, padding 0; the intent (4) is carried by which keyword family occurs."""
    g = torch.Generator().manual_seed(s)
    y = torch.randint(0, 4, (n,), generator=g)
    lengths = torch.randint(6, length - 1, (n,), generator=g)
    ids = torch.zeros(n, length, dtype=torch.long)
    att = torch.zeros(n, length, dtype=torch.long)
    for i in range(n):
        body = torch.randint(20, vocab, (int(lengths[i]),), generator=g)
        body[int(torch.randint(0, int(lengths[i]), (1,), generator=g))] = 4 + 4 * int(y[i]) + int(
            torch.randint(0, 4, (1,), generator=g))
        seq = torch.cat([torch.tensor([2]), body, torch.tensor([3])])
        ids[i, :len(seq)] = seq
        att[i, :len(seq)] = 1
    return ids, att, y


def tiny_bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=96, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertModel(cfg, add_pooling_layer=False)


class IntentClassifier(nn.Module):
    def __init__(self, layer=0):
        super().__init__()
        self.layer = layer
        self.bert = tiny_bert()
        self.head = nn.Linear(48, 4)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return self.head(out.hidden_states[self.layer][:, 0])          # the [CLS] vector


def intent_ce(model, batch):
    ids, att, y = batch
    return F.cross_entropy(model(ids, att), y)


def intent_acc(model, kw):
    return accuracy(model, kw["val_loader"], lambda m, b: (m(b[0], b[1]).argmax(-1), b[2]))


def _intents(fix=False):
    seed(0)
    ids, att, y = intent_utterances(s=24)
    model = IntentClassifier(layer=-1 if fix else 0)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], att[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], att[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=intent_ce, max_steps=2000)


@case("bert_intent_head_reads_hidden_states_0", "what_is_trained",
      bug="the intent head reads outputs.hidden_states[0][:, 0], taking hidden_states[0] for the last layer: it is the "
          "embedding layer's output, so the [CLS] vector is the same token + position embedding for every utterance; "
          "the encoder layers never contribute (their gradients are None) and the head cannot see the words "
          "(hidden_states[-1] / last_hidden_state)",
      cause_pattern=r"hidden_states|embedding (layer )?output|(encoder|transformer|bert) (layers?|blocks?)[^.]*(unused|"
                    r"never|no grad|not used|skipped|bypass|none)|(no|none|zero|without) grad\w*[^.]*(encoder|layers?)|"
                    r"never (used|contribut)|last_hidden_state|grad(ient)?s? (is|are) None|\.grad (is )?None|"
                    r"(unused|never used) param")
def bert_intent_head_reads_hidden_states_0():
    return _intents()


def _fact_intents():
    kw = _intents()
    m = kw["model"]
    ids, att, y = next(iter(kw["train_loader"]))
    intent_ce(m, (ids, att, y)).backward()
    no_grad = sum(p.grad is None for n, p in m.named_parameters() if ".encoder." in n)
    total = sum(1 for n, _ in m.named_parameters() if ".encoder." in n)
    print(f"  encoder parameters with grad None after backward: {no_grad} of {total}")


fix("bert_intent_head_reads_hidden_states_0", lambda: _intents(True), intent_acc, "val acc", _fact_intents,
    steps=200)

# --------------------------------------------------------------------------- 5: ReLU biases initialised to -3


def pump_readings(n=4000, d=16, s=0):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(n, d, generator=g)
    h = torch.tanh(x @ torch.randn(d, 8, generator=g))
    return x, (h @ torch.randn(8, 3, generator=g)).argmax(1)


def sparse_init(module, bias=-3.0):
    """Xavier weights, a negative bias 'so that only strong features fire' (sparse activations)."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.constant_(module.bias, bias)


def pump_mlp(bias):
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    model.apply(lambda m: sparse_init(m, bias))
    return model


def _pumps(fix=False):
    seed(0)
    x, y = pump_readings(s=25)
    model = pump_mlp(0.0 if fix else -3.0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3400], y[:3400]), 64),
                val_loader=loader(TensorDataset(x[3400:], y[3400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("pump_mlp_relu_biases_initialised_to_minus_3", "what_is_trained",
      bug="the init function gives every Linear a bias of -3 'for sparse activations' on top of Xavier weights: with "
          "standardised inputs the pre-activations are ~N(-3, 0.6), so every ReLU unit outputs 0 for every sample, "
          "no gradient reaches any hidden weight and only the output bias learns (the class prior); bias 0 is the fix",
      cause_pattern=r"\bdead|relu[^.]*(inactive|never (fire|activ)|zero|dead|negative)|bias(es)?[^.]*(negative|-3(\.0)"
                    r"?)|bias(es)? (are |were )?initiali[sz]|(activations?|units?|neurons?|hidden)[^.]*(all )?(zero|in"
                    r"active|never (fire|activate)|dead)")
def pump_mlp_relu_biases_initialised_to_minus_3():
    return _pumps()


def _fact_pumps():
    kw = _pumps()
    x, _ = next(iter(kw["train_loader"]))
    h = kw["model"][:2](x)
    print(f"  first hidden layer units active on any of 64 samples: {(h > 0).any(0).sum().item()} of 64")


fix("pump_mlp_relu_biases_initialised_to_minus_3", lambda: _pumps(True), val_acc, "val acc", _fact_pumps)

# --------------------------------------------------------------------------- 6: CLIP logit_scale stored unlogged


def song_lyrics(n=3000, d_audio=20, d_text=20, s=0):
    g = torch.Generator().manual_seed(s)
    z = torch.randn(n, 6, generator=g)
    audio = z @ torch.randn(6, d_audio, generator=g) + 0.4 * torch.randn(n, d_audio, generator=g)
    text = z @ torch.randn(6, d_text, generator=g) + 0.4 * torch.randn(n, d_text, generator=g)
    return audio, text


class AudioTextCLIP(nn.Module):
    def __init__(self, init_logit_scale):
        super().__init__()
        self.audio = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32))
        self.text = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32))
        self.logit_scale = nn.Parameter(torch.tensor(float(init_logit_scale)))

    def forward(self, audio, text):
        a = F.normalize(self.audio(audio), dim=-1)
        t = F.normalize(self.text(text), dim=-1)
        return self.logit_scale.exp() * a @ t.T


def symmetric_clip_loss(model, batch):
    audio, text = batch
    logits = model(audio, text)
    labels = torch.arange(len(audio))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


@torch.no_grad()
def song_top1(model, kw):
    a, t = kw["val_loader"].dataset.tensors
    return (model(a[:200], t[:200]).argmax(1) == torch.arange(200)).float().mean().item()


def _songs(fix=False):
    import math
    seed(0)
    audio, text = song_lyrics(s=26)
    model = AudioTextCLIP(math.log(1 / 0.07) if fix else 1 / 0.07)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(audio[:2600], text[:2600]), 64, drop_last=True),
                val_loader=loader(TensorDataset(audio[2600:], text[2600:]), 200, shuffle=False),
                loss_fn=symmetric_clip_loss, max_steps=3000)


@case("song_lyrics_clip_logit_scale_initialised_unlogged", "what_is_trained",
      bug="CLIP stores the temperature as logit_scale = log(1 / 0.07) and multiplies by logit_scale.exp(); the port "
          "initialises the parameter to 1 / 0.07 = 14.3 itself, so the logits are scaled by e^14.3 = 1.6e6: the "
          "softmax is saturated, the loss is in the tens of thousands and is driven only by the hardest negative "
          "(init the parameter to math.log(1 / 0.07))",
      cause_pattern=r"logit_scale|temperature|(softmax|logits?)[^.]*saturat|saturat\w*[^.]*(softmax|logits?)|(logits?|"
                    r"similarit\w*)[^.]*(scale|multipl)\w*[^.]*(1\.6e\+?0?6|\d+e\+0?[5-9]|huge|too (large|big|high))|("
                    r"scale|multiplier)[^.]*(1\.6e\+?0?6|e\^?14|huge|too (large|big|high))|math\.log|exp\(14")
def song_lyrics_clip_logit_scale_initialised_unlogged():
    return _songs()


def _fact_songs():
    m = _songs()["model"]
    print(f"  logit_scale {m.logit_scale.item():.1f} -> logits multiplied by {m.logit_scale.exp().item():.2e}")


fix("song_lyrics_clip_logit_scale_initialised_unlogged", lambda: _songs(True), song_top1,
    "val audio->lyrics top-1 of 200", _fact_songs)

# --------------------------------------------------------------------------- 7: positions added out of place


def alarm_orders(n=3000, length=10, vocab=20, s=0):
    """Event logs; label 1 when the 'reset' event (4) comes before the 'alarm' event (5)."""
    g = torch.Generator().manual_seed(s)
    ids = torch.randint(6, vocab, (n, length), generator=g)
    for i in range(n):
        a, b = torch.randperm(length, generator=g)[:2].tolist()
        ids[i, a], ids[i, b] = 4, 5
    y = ((ids == 4).float().argmax(1) < (ids == 5).float().argmax(1)).long()
    return ids, y


class EventEncoder(nn.Module):
    def __init__(self, vocab=20, d=48, length=10, in_place=False):
        super().__init__()
        self.in_place = in_place
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(length, d)
        layer = nn.TransformerEncoderLayer(d, 4, 96, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        h = self.tok(ids)
        positions = self.pos(torch.arange(ids.size(1)))
        if self.in_place:
            h = h + positions
        else:
            h.add(positions)                         # add the learned positions
        return self.head(self.encoder(h).mean(1))


def _alarms(fix=False):
    seed(0)
    ids, y = alarm_orders(s=27)
    model = EventEncoder(in_place=fix)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(ids[:2500], y[:2500]), 32),
                val_loader=loader(TensorDataset(ids[2500:], y[2500:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


@case("alarm_log_position_embedding_added_out_of_place", "what_is_trained",
      bug="the learned position embeddings are applied with h.add(positions), whose result is thrown away (add is "
          "out of place; add_ or h = h + positions was meant): the position table never reaches the output and gets "
          "no gradient, the encoder is order-blind and cannot tell whether the reset came before the alarm",
      cause_pattern=r"add_|out.of.place|(result|return value|output)[^.]*(discard|ignor|thrown away|unused|never used)"
                    r"|discard\w*|position\w*[^.]*(never|unused|no grad|not (used|added)|none)|(no|zero|without) grad"
                    r"\w*[^.]*position|order.?(blind|invariant)|permutation.?invariant|grad(ient)? is None")
def alarm_log_position_embedding_added_out_of_place():
    return _alarms()


def _fact_alarms():
    kw = _alarms()
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(m(x), y).backward()
    print(f"  position embedding grad after backward: {m.pos.weight.grad}")


fix("alarm_log_position_embedding_added_out_of_place", lambda: _alarms(True), val_acc, "val acc", _fact_alarms)
