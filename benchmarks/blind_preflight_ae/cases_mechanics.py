"""Set ae, family mechanics: the loss terms, masks, states or layers work against learning while the code runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ae.models import seq2seq_batches
from benchmarks.blind_preflight_ae.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    smooth_signals,
)


# 1. A VAE for sensor traces whose reconstruction term is F.mse_loss's per-element mean while the KL term is summed
#    over the batch and the latent dims: the KL outweighs reconstruction ~B*D-fold and the posterior collapses.
class TraceVAE(nn.Module):
    def __init__(self, d: int = 64, latent: int = 8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, latent), nn.Linear(128, latent)
        self.dec = nn.Sequential(nn.Linear(latent, 128), nn.ReLU(), nn.Linear(128, d))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp() if self.training else mu
        return self.dec(z), mu, logvar


def vae_loss(recon_reduction: str):
    def loss_fn(model, batch):
        (x,) = batch
        recon, mu, logvar = model(x)
        rec = F.mse_loss(recon, x, reduction=recon_reduction)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (rec + kl) / (x.shape[0] if recon_reduction == "sum" else 1)
    return loss_fn


def vae_kl_scale(fixed: bool = False):
    seed(0)
    x = smooth_signals(1500, 64, rank=4, s=111)
    model = TraceVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1200]), 64),
                val_loader=loader(TensorDataset(x[1200:], x[1200:]), 300, shuffle=False),
                loss_fn=vae_loss("sum" if fixed else "mean"), max_steps=3000)


case("vae_kl_summed_reconstruction_averaged", "mechanics",
     bug="The VAE loss adds a KL term summed over the batch and the latent dimensions (torch.sum) to a reconstruction "
         "term that F.mse_loss averages over every element (reduction='mean'): the KL is weighted about B x 64 times "
         "more than reconstruction, the posterior collapses to the prior and the decoder outputs the mean trace; "
         "reduce both terms the same way (e.g. reduction='sum' for the reconstruction, then divide both by B).",
     cause_pattern=r"posterior collapse|collapses? to the prior|KL.{0,100}(sum|summed).{0,100}(mean|averag)"
                   r"|(mean|averag)\w*.{0,100}KL.{0,60}(sum|summed)|KL (term )?(dominates|outweighs|overwhelms)"
                   r"|(reduce|scale|normali[sz]e) both (terms|losses) the same|reduction\s*=\s*['\"]sum['\"].{0,60}reconstruction")(vae_kl_scale)
fix("vae_kl_summed_reconstruction_averaged", fixed_of(vae_kl_scale),
    rmse_of(lambda m, b: (m(b[0])[0], b[1])), "val reconstruction RMSE (posterior mean)", higher=False)


# 2. An autoencoder for vibration spectra that regularises with F.dropout(h, 0.5) in forward() but without
#    training=self.training: dropout stays on after model.eval(), so every evaluation reconstruction is noisy.
class DropAE(nn.Module):
    def __init__(self, d: int = 64, respect_eval: bool = False):
        super().__init__()
        self.enc1, self.enc2 = nn.Linear(d, 128), nn.Linear(128, 16)
        self.dec1, self.dec2 = nn.Linear(16, 128), nn.Linear(128, d)
        self.respect_eval = respect_eval

    def forward(self, x):
        h = F.relu(self.enc1(x))
        h = F.dropout(h, 0.5, training=self.training) if self.respect_eval else F.dropout(h, 0.5)
        return self.dec2(F.relu(self.dec1(F.relu(self.enc2(h)))))


def dropout_ae(fixed: bool = False):
    seed(0)
    x = smooth_signals(1500, 64, rank=6, s=121)
    model = DropAE(respect_eval=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1200], x[:1200]), 64),
                val_loader=loader(TensorDataset(x[1200:], x[1200:]), 300, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ae_functional_dropout_ignores_eval", "mechanics",
     bug="forward() calls torch.nn.functional.dropout(h, 0.5) without training=self.training; F.dropout defaults to "
         "training=True, so model.eval() does not switch it off and every validation / inference reconstruction is "
         "computed with half the hidden units dropped; pass training=self.training or use an nn.Dropout module.",
     cause_pattern=r"F\.dropout|functional\.dropout|training\s*=\s*self\.training|dropout.{0,80}(eval\(\)|eval mode|inference|evaluation).{0,40}(still|active|on|not (switch|disabl|turn))"
                   r"|(still|stays?|remains?) (active|on|enabled).{0,60}(eval|inference)|nn\.Dropout module")(dropout_ae)
fix("ae_functional_dropout_ignores_eval", fixed_of(dropout_ae),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val reconstruction RMSE (eval mode)", higher=False)


# 3. A GRU encoder-decoder (transliteration-style cipher) whose decoder GRU is called without the encoder's final
#    hidden state: it starts from zeros and never sees the source sequence.
class CipherSeq2Seq(nn.Module):
    def __init__(self, vocab: int, d: int = 64, pass_hidden: bool = False):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.encoder, self.decoder = nn.GRU(d, d, batch_first=True), nn.GRU(d, d, batch_first=True)
        self.proj = nn.Linear(d, vocab)
        self.pass_hidden = pass_hidden

    def forward(self, src, dec_in):
        _, hidden = self.encoder(self.src_emb(src))
        out, _ = self.decoder(self.tgt_emb(dec_in), hidden) if self.pass_hidden else self.decoder(self.tgt_emb(dec_in))
        return self.proj(out)


def seq2seq_zero_hidden(fixed: bool = False):
    seed(0)
    vocab = 16
    src, dec_in, tgt = seq2seq_batches(3000, 6, vocab, "shift", s=131)
    vs, vd, vt = seq2seq_batches(500, 6, vocab, "shift", s=132)
    model = CipherSeq2Seq(vocab, pass_hidden=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src, dec_in, tgt), 64),
                val_loader=loader(TensorDataset(vs, vd, vt), 250, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).permute(0, 2, 1), b[2]), max_steps=3000)


case("seq2seq_decoder_starts_from_zero_state", "mechanics",
     bug="The decoder GRU is called as self.decoder(embedded_targets) without the encoder's final hidden state, so "
         "its initial state h0 defaults to zeros and nothing about the source sequence reaches the decoder; the "
         "encoder's output is computed and discarded. Pass the encoder hidden state as the decoder's h0.",
     cause_pattern=r"(initial|first) (hidden )?state.{0,60}(zeros?|default)|h0.{0,60}(zeros?|default|encoder)"
                   r"|encoder'?s? (final )?(hidden|state|output).{0,80}(discarded|unused|never (reaches|used|passed)|not passed)"
                   r"|(never|not) (sees?|receives?|conditioned on) the (source|input|encoder)|pass the encoder'?s? (final )?hidden")(seq2seq_zero_hidden)
fix("seq2seq_decoder_starts_from_zero_state", fixed_of(seq2seq_zero_hidden),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val teacher-forced token accuracy")


# 4. An nn.Transformer encoder-decoder (running-sum task) trained with teacher forcing but called without tgt_mask: each target
#    position attends to the following decoder inputs, i.e. to the token it must predict, and learns to copy it.
class TinySeq2SeqTransformer(nn.Module):
    def __init__(self, vocab: int, length: int, d: int = 64, causal: bool = False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length + 1, d) * 0.1)
        self.core = nn.Transformer(d, 4, 2, 2, 128, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)
        self.causal = causal

    def forward(self, src, dec_in):
        t = dec_in.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=dec_in.device) if self.causal else None
        h = self.core(self.emb(src) + self.pos[: src.shape[1]], self.emb(dec_in) + self.pos[:t], tgt_mask=mask)
        return self.out(h)


@torch.no_grad()
def greedy_acc(model, kw):
    def fn(m, b):
        src, _, tgt = b
        dec = torch.ones(src.shape[0], 1, dtype=torch.long, device=src.device)
        for _ in range(tgt.shape[1]):
            dec = torch.cat([dec, m(src, dec)[:, -1].argmax(-1, keepdim=True)], 1)
        return (dec[:, 1:] == tgt).sum().item(), tgt.numel()
    dev = next(model.parameters()).device
    return mean_over(model, [[t.to(dev) for t in b] for b in kw["val_loader"]], fn)


def running_sum_batches(n: int, length: int, vocab: int, s: int):
    """Target token t = (sum of source values up to t) mod (vocab - 2): each target builds on the previous one."""
    src = torch.randint(2, vocab, (n, length), generator=gen(s))
    tgt = (src - 2).cumsum(1) % (vocab - 2) + 2
    dec_in = torch.cat([torch.ones(n, 1, dtype=torch.long), tgt[:, :-1]], 1)
    return src, dec_in, tgt


def transformer_no_mask(fixed: bool = False):
    seed(0)
    vocab, length = 8, 8
    src, dec_in, tgt = running_sum_batches(3000, length, vocab, s=141)
    vs, vd, vt = running_sum_batches(300, length, vocab, s=142)
    model = TinySeq2SeqTransformer(vocab, length, causal=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(src, dec_in, tgt), 64),
                val_loader=loader(TensorDataset(vs, vd, vt), 300, shuffle=False),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]).permute(0, 2, 1), b[2]), max_steps=3000)


case("transformer_decoder_without_causal_mask", "mechanics",
     bug="The nn.Transformer is trained with teacher forcing but called without tgt_mask (no causal / square "
         "subsequent mask): every target position attends to later decoder inputs, which contain the token it must "
         "predict, so training loss falls to ~0 by copying while greedy decoding fails; pass "
         "tgt_mask=nn.Transformer.generate_square_subsequent_mask(T).",
     cause_pattern=r"tgt_mask|causal (attention )?mask|(square[_ ])?subsequent[_ ]mask|look[- ]ahead mask"
                   r"|attends? to (later|future|following) (decoder )?(inputs|positions|tokens)|see (the )?future tokens")(transformer_no_mask)
fix("transformer_decoder_without_causal_mask", fixed_of(transformer_no_mask), greedy_acc,
    "val greedy-decoding token accuracy", steps=400)


# 5. Distilling an intent classifier into a small student on unlabelled utterance features: the student's
#    probabilities (softmax) are passed to F.kl_div, whose input must be log-probabilities.
class KDStudent(nn.Module):
    def __init__(self, teacher: nn.Module):
        super().__init__()
        self.teacher = teacher.requires_grad_(False).eval()
        self.student = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.student(x)


def kd_probs_loss(log_input: bool, T: float = 2.0):
    def loss_fn(model, batch):
        (x,) = batch
        s = model(x)
        with torch.no_grad():
            t = F.softmax(model.teacher(x) / T, dim=1)
        inp = F.log_softmax(s / T, dim=1) if log_input else F.softmax(s / T, dim=1)
        return F.kl_div(inp, t, reduction="batchmean") * T * T
    return loss_fn


def intent_teacher():
    torch.manual_seed(151)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))


def kd_probabilities(fixed: bool = False):
    seed(0)
    x = torch.randn(3000, 32, generator=gen(152))
    model = KDStudent(intent_teacher())
    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:]), 500, shuffle=False),
                loss_fn=kd_probs_loss(log_input=fixed), max_steps=3000)


def soft_ce_to_teacher(model, kw):
    def fn(m, b):
        (x,) = b
        t = F.softmax(m.teacher(x), dim=1)
        return -(t * F.log_softmax(m(x), dim=1)).sum().item(), x.shape[0]
    return mean_over(model, kw["val_loader"], fn)


case("kd_kl_div_given_student_probabilities", "mechanics",
     bug="The distillation loss passes the student's probabilities, F.softmax(student_logits / T), as the input of "
         "F.kl_div, which expects log-probabilities (log_softmax): the term becomes -sum(p_teacher * p_student) + "
         "const, which only pushes the student to put all its mass on the teacher's top class instead of matching "
         "its distribution; use F.log_softmax for the input.",
     cause_pattern=r"kl_div.{0,80}(given|gets|receives|passed|fed) (the )?(student'?s? )?(softmax(ed)? )?probabilit"
                   r"|softmax.{0,60}(passed (to|as)|given to|as the input of|into) (F\.)?kl_div"
                   r"|(expects|requires|needs) log[- ]?probabilit\w*.{0,60}(but|not|gets|got|receives|instead)"
                   r"|probabilities.{0,40}instead of log[- ]?(probabilit|softmax)|log_softmax for the (kl_div )?input")(kd_probabilities)
fix("kd_kl_div_given_student_probabilities", fixed_of(kd_probabilities), soft_ce_to_teacher,
    "val cross-entropy to the teacher's distribution", higher=False)
