"""Train a drafter (MTP, DFlash or DFly) against the bundle's target: `specroute train <kind>`.

1. Self-distillation data (`engines.training.distill`): the target's greedy responses to TRAIN
   prompts (balanced chat/code/math), plus its features (captured layers + final hidden), generated
   once and cached under the work directory for all three drafters. Held-out prompts are only used
   to *report* accuracy (no gradient, no checkpoint selection).
2. Losses on response positions only:
   - MTP: training-time test with `ttt_steps` unrolled chain steps; step 0 teacher-forced, later
     steps on-policy (own argmax and own output hidden, as at inference); attention over the step
     caches follows the inference chain exactly; step weights `ttt_decay**s`.
   - DFlash/DFly: random anchors in the response; block `[x_a, MASK...]` at positions a..a+B-1 sees
     context < a and its own block (dense boolean mask + SDPA); slot k predicts x_{a+k}; CE weighted
     by exp(-(k-1)/gamma), gamma = B/2; block 16 mixed with block 8 so one set of weights serves both.
     DFly's correction head is teacher-forced on the true predecessor tokens.
3. bf16 autocast, AdamW, warmup + cosine, tqdm progress (loss, top-1 accuracy, tau), checkpoints
   with resume (model, optimiser, step, RNG), fixed seed.
4. Output: `OUT/drafters/<kind>/{config.json,model.safetensors,train_<kind>.json}`.

Accuracy proxies: per-position top-1 accuracy and tau = 1 + E[accepted drafts] at T=0 (the leading
run of correct drafts plus the bonus token). For block drafters and on-policy MTP this is exactly what
greedy speculative decoding accepts on the same text.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from engines.drafters.base import Drafter
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.layers import build_target_layer_ids, freeze, target_fingerprint
from engines.drafters.mtp import MTPDrafter
from engines.drafters.registry import DRAFTERS, new_drafter, save_drafter
from engines.model import Transformer, load_model
from engines.tokenizer import Tokenizer
from engines.training.data import DOMAINS
from engines.training.distill import DistillSet, Features, build_set, cached_data, pick_prompts, set_key
from specroute.errors import UserError


@dataclass(frozen=True)
class DrafterPreset:
    # data
    per_domain: int = 700           # train prompts per domain (self-distillation)
    heldout_per_domain: int = 40    # held-out prompts per domain (reporting only)
    max_prompt: int = 320
    max_new: int = 192
    gen_batch: int = 64
    n_target_layers: int = 3
    # model
    mtp_layers: int = 1
    block_layers: int = 2
    block_size: int = 16
    # optimisation
    steps: dict[str, int] = field(default_factory=lambda: {"mtp": 2000, "dflash": 2000, "dfly": 2000})
    # wall-time budget per drafter: after `calibrate_at` steps the total is fixed to what fits (<= steps)
    time_budget_s: float | None = 600.0
    calibrate_at: int = 20
    batch_size: int = 8
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 40
    weight_decay: float = 0.01
    ttt_steps: int = 3
    ttt_decay: float = 0.8
    anchors: int = 32
    block_mix: tuple[tuple[int, float], ...] = ((16, 0.75), (8, 0.25))  # (block size, probability)
    eval_every: int = 100_000        # besides half-way and at the end
    ckpt_every: int = 50
    seed: int = 1234
    threads: int = 2
    draft_vocab: int = 2048          # drafting head rows: the target's most frequent output tokens (0 = all)


PRESETS = {
    "demo": DrafterPreset(),
    "tiny": DrafterPreset(per_domain=3, heldout_per_domain=1, max_prompt=96, max_new=10, gen_batch=4,
                          steps={"mtp": 6, "dflash": 6, "dfly": 6}, batch_size=2, warmup=2, anchors=4,
                          block_size=4, block_mix=((4, 0.5), (3, 0.5)), eval_every=3, ckpt_every=2, threads=1,
                          time_budget_s=None),
}


def lr_at(step: int, total: int, p: DrafterPreset) -> float:
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    frac = min(1.0, (step - p.warmup) / max(1, total - p.warmup))
    return p.min_lr + 0.5 * (p.lr - p.min_lr) * (1 + math.cos(math.pi * frac))


# --- batches ------------------------------------------------------------------------------------


@dataclass
class Batch:
    tokens: Tensor       # [B, S]
    feats: Tensor        # [B, S, F] (MTP: final hidden; block drafters: captured layers)
    lengths: Tensor      # [B]
    prompt_lens: Tensor  # [B]


def make_batch(data: DistillSet, feats: Features, idx: list[int], kind: str) -> Batch:
    lens = [len(data.tokens[i]) for i in idx]
    S = max(lens)
    src = feats.final if kind == "mtp" else feats.captured
    tokens = torch.zeros(len(idx), S, dtype=torch.long)
    out = torch.zeros(len(idx), S, src.shape[1])
    for r, i in enumerate(idx):
        tokens[r, :lens[r]] = torch.tensor(data.tokens[i])
        out[r, :lens[r]] = src[feats.rows(i)].float()
    return Batch(tokens, out, torch.tensor(lens), torch.tensor([data.prompt_lens[i] for i in idx]))


# --- MTP: training-time test --------------------------------------------------------------------


def ttt_mask(P: int, s: int) -> Tensor:
    """Keys [step 0 | step 1 | ... | step s] for queries of step s at positions p (chain start p-s):
    step-0 entries at positions <= p-s (the committed prefix) and the chain's own step-j entry at
    position p-s+j. -> [1, 1, P, (s+1)P]."""
    q = torch.arange(P)[:, None]
    i = torch.arange(P)[None, :]
    blocks = [i <= q - s] + [i == q - s + j for j in range(1, s + 1)]
    return torch.cat(blocks, dim=1)[None, None]


@dataclass
class StepOut:
    loss: Tensor
    correct: Tensor   # [N, K] bool, per chain/block and draft position
    valid: Tensor     # [N, K] bool
    pred: Tensor | None = None  # [N, K] argmax drafts (same layout)


def mtp_loss(d: MTPDrafter, b: Batch, steps: int, decay: float, on_policy: bool = True) -> StepOut:
    B, S = b.tokens.shape
    P = S - 2
    pos = torch.arange(P).expand(B, P)
    labels = b.tokens[:, 2:]                                  # position p predicts x_{p+2}
    p_idx = torch.arange(P)[None]
    h_in, t_in = b.feats[:, :P], b.tokens[:, 1:P + 1]         # entry p = (h_p, x_{p+1})
    keys: list[Tensor] = []
    values: list[Tensor] = []
    total = torch.zeros(())
    wsum = 0.0
    corrects, valids, preds = [], [], []
    for s in range(steps):
        def kv_fn(k: Tensor, v: Tensor, s: int = s) -> tuple[Tensor, Tensor, Tensor]:
            keys.append(k)
            values.append(v)
            return torch.cat(keys, 1), torch.cat(values, 1), ttt_mask(P, s)
        out = d.step(h_in, t_in, pos, kv_fn)                   # [B, P, H]
        # chain start c = p - s must be at or after the last prompt position (first drafted call);
        # the LM head only runs where a label is scored (these are also the only predictions the
        # next on-policy step reads)
        valid = (p_idx - s >= b.prompt_lens[:, None] - 1) & (p_idx + 2 < b.lengths[:, None])
        logits = d.head(out[valid])                           # [N, V] fp32
        ce = F.cross_entropy(logits, labels[valid])
        pred = torch.zeros_like(labels)
        pred[valid] = logits.argmax(-1)
        w = decay ** s
        if bool(valid.any()):
            total = total + w * ce
        wsum += w
        # align by chain start c: step s of chain c sits at position c + s
        corrects.append(F.pad(pred == labels, (0, s))[:, s:])
        valids.append(F.pad(valid, (0, s))[:, s:])
        preds.append(F.pad(pred, (0, s))[:, s:])
        h_in = F.pad(out[:, :-1], (0, 0, 1, 0))
        if on_policy:
            t_in = F.pad(pred[:, :-1].detach(), (1, 0))
    correct = torch.stack(corrects, -1).reshape(B * P, steps)
    valid = torch.stack(valids, -1).reshape(B * P, steps)
    pred = torch.stack(preds, -1).reshape(B * P, steps)
    keep = valid[:, 0]
    return StepOut(total / wsum, correct[keep], valid[keep], pred[keep])


# --- block drafters -----------------------------------------------------------------------------


def sample_anchors(b: Batch, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Up to n distinct anchors a in [prompt_len, length-2] per row -> anchors, keep [B, n]."""
    B = b.tokens.shape[0]
    anchors = torch.zeros(B, n, dtype=torch.long)
    keep = torch.zeros(B, n, dtype=torch.bool)
    for r in range(B):
        lo, hi = int(b.prompt_lens[r]), int(b.lengths[r]) - 1
        m = max(0, hi - lo)
        take = torch.randperm(m, generator=gen)[:n] + lo if m else torch.zeros(0, dtype=torch.long)
        take = take.sort().values
        anchors[r, :len(take)] = take
        keep[r, :len(take)] = True
    return anchors, keep


def block_loss(d: DFlashDrafter, b: Batch, anchors: Tensor, keep: Tensor, block: int,
               gamma: float | None = None) -> StepOut:
    B, S = b.tokens.shape
    A = anchors.shape[1]
    Q = A * block
    ctx_kv = d.context_kv(b.feats, torch.arange(S).expand(B, S))
    bpos = anchors[:, :, None] + torch.arange(block)                        # [B, A, Bk]
    labels = b.tokens.gather(1, bpos.clamp(max=S - 1).view(B, -1)).view(B, A, block)
    inp = torch.full_like(labels, int(d.cfg.mask_token_id or 0))
    inp[..., 0] = labels[..., 0]
    seen = torch.arange(S)[None, None, :] < anchors[:, :, None]             # [B, A, S]
    seen = seen[:, :, None, :].expand(B, A, block, S).reshape(B, Q, S)
    blk = torch.arange(Q) // block
    own = (blk[:, None] == blk[None, :]).expand(B, Q, Q)
    mask = torch.cat([seen, own], dim=-1)[:, None]                           # [B, 1, Q, S+Q]
    h = d.backbone(inp.view(B, Q), bpos.view(B, Q), ctx_kv, mask).view(B, A, block, -1)
    logits = d.draft_logits(h, labels)                                       # [B, A, Bk-1, V]
    target = labels[..., 1:]
    valid = (bpos[..., 1:] < b.lengths[:, None, None]) & keep[..., None]
    gamma = gamma or block / 2
    w = torch.exp(-torch.arange(block - 1, dtype=torch.float32) / gamma)    # slot k: exp(-(k-1)/gamma)
    ce = F.cross_entropy(logits.permute(0, 3, 1, 2), target, reduction="none")  # [B, A, Bk-1]
    wv = w * valid
    loss = (ce * wv).sum() / wv.sum().clamp(min=1e-6)
    pred = logits.argmax(-1).reshape(B * A, block - 1)
    correct = pred == target.reshape(B * A, block - 1)
    k = keep.view(-1)
    return StepOut(loss, correct[k], valid.reshape(B * A, block - 1)[k], pred[k])


def all_anchors(b: Batch, chunk: int) -> list[tuple[Tensor, Tensor]]:
    """Every response position as an anchor (evaluation), in chunks of `chunk` per row."""
    B = b.tokens.shape[0]
    spans = [(int(b.prompt_lens[r]), int(b.lengths[r]) - 1) for r in range(B)]
    longest = max(hi - lo for lo, hi in spans)
    out = []
    for c in range(0, max(longest, 0), chunk):
        anchors = torch.zeros(B, chunk, dtype=torch.long)
        keep = torch.zeros(B, chunk, dtype=torch.bool)
        for r, (lo, hi) in enumerate(spans):
            a = torch.arange(lo + c, max(lo + c, min(hi, lo + c + chunk)))
            anchors[r, :len(a)] = a
            keep[r, :len(a)] = True
        out.append((anchors, keep))
    return out


# --- metrics ------------------------------------------------------------------------------------


def summarize(outs: list[StepOut]) -> dict:
    """Per-position top-1 accuracy and tau = 1 + E[leading run of correct drafts]."""
    if not outs:
        return {"acc": [], "tau": 1.0, "n": 0}
    K = max(o.correct.shape[1] for o in outs)
    acc_n, acc_d = torch.zeros(K), torch.zeros(K)
    run_sum, n = 0.0, 0
    for o in outs:
        k = o.correct.shape[1]
        ok = o.correct & o.valid
        acc_n[:k] += ok.sum(0).float()
        acc_d[:k] += o.valid.sum(0).float()
        run_sum += float(ok.long().cumprod(1).sum())
        n += o.correct.shape[0]
    acc = (acc_n / acc_d.clamp(min=1)).tolist()
    return {"acc": [round(a, 4) for a in acc], "tau": round(1 + run_sum / max(n, 1), 4), "n": n}


@torch.no_grad()
def evaluate(d: Drafter, data: DistillSet, feats: Features, p: DrafterPreset,
             blocks: tuple[int, ...] | None = None) -> dict:
    """Per domain: tau and per-position accuracy on `data` (held-out prompts' target responses)."""
    d.eval()
    kind = d.kind
    blocks = blocks or ((p.ttt_steps,) if kind == "mtp" else tuple(sorted({p.block_size, p.block_size // 2}, reverse=True)))
    res: dict = {}
    for blk in blocks:
        per_dom: dict[str, list[StepOut]] = {dom: [] for dom in DOMAINS}
        for dom in DOMAINS:
            rows = [i for i in range(len(data)) if data.domains[i] == dom]
            for c in range(0, len(rows), 8):
                b = make_batch(data, feats, rows[c:c + 8], kind)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    if isinstance(d, MTPDrafter):
                        per_dom[dom].append(mtp_loss(d, b, blk, p.ttt_decay))
                    else:
                        assert isinstance(d, DFlashDrafter)
                        per_dom[dom] += [block_loss(d, b, a, k, blk) for a, k in all_anchors(b, 32)]
        key = f"k{blk}" if kind == "mtp" else f"block{blk}"
        res[key] = {dom: summarize(o) for dom, o in per_dom.items() if o}
        taus = [v["tau"] for v in res[key].values()]
        res[key]["mean_tau"] = round(sum(taus) / max(len(taus), 1), 4)
    d.train()
    return res


# --- the pipeline -------------------------------------------------------------------------------


def prepare_data(target: Transformer, tok: Tokenizer, p: DrafterPreset, work: Path, layers: list[int]
                 ) -> tuple[DistillSet, Features, DistillSet, Features]:
    fp = target_fingerprint(target)
    key = set_key(fp, p.per_domain, p.max_prompt, p.max_new, p.seed, layers)
    train, train_f = cached_data(work / f"selfdistill_{key}", lambda: build_set(
        target, tok, pick_prompts("train", p.per_domain, p.seed), p.max_prompt, p.max_new, p.gen_batch,
        layers, "self-distill (train prompts)"))
    hkey = set_key(fp, p.heldout_per_domain, p.max_prompt, p.max_new, p.seed, layers)
    held, held_f = cached_data(work / f"heldout_{hkey}", lambda: build_set(
        target, tok, pick_prompts("heldout", p.heldout_per_domain, p.seed), p.max_prompt, p.max_new,
        p.gen_batch, layers, "responses (held-out prompts, eval only)"))
    return train, train_f, held, held_f


def train_drafter(kind: str, out_dir: Path, preset: str = "demo", work_dir: Path | None = None,
                  resume: bool = True, stop_after: int | None = None, budget_s: float | None = None,
                  max_steps: int | None = None) -> dict:
    """Train `kind` for the bundle in `out_dir`; `stop_after` ends this run early at that step (after
    a checkpoint), as an interruption would; a later call resumes. `budget_s` / `max_steps` override
    the preset's wall-time budget and step cap."""
    if kind not in DRAFTERS:
        raise UserError(f"unknown drafter {kind!r} (have {', '.join(DRAFTERS)})")
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r} (have {', '.join(PRESETS)})")
    p = PRESETS[preset]
    if budget_s is not None:
        p = replace(p, time_budget_s=budget_s)
    if max_steps is not None:
        p = replace(p, steps={**p.steps, kind: max_steps})
    out_dir = Path(out_dir)
    if not (out_dir / "model.safetensors").is_file():
        raise UserError(f"no target model in {out_dir}: run `specroute train target --out {out_dir}` first")
    work = Path(work_dir or out_dir / ".work")
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(p.threads)
    torch.manual_seed(p.seed)
    t_start = time.perf_counter()

    target = load_model(out_dir)
    freeze(target)
    tok = Tokenizer.load(out_dir)
    L = target.config.num_hidden_layers
    layers = build_target_layer_ids(L, p.n_target_layers) if L > 3 else list(range(min(L, p.n_target_layers)))
    data, feats, held, held_feats = prepare_data(target, tok, p, work, layers)
    data_seconds = time.perf_counter() - t_start
    if not len(data):
        raise UserError("no training prompts fit the preset's prompt length")

    cfg: dict[str, object] = {"num_layers": p.mtp_layers if kind == "mtp" else p.block_layers}
    if kind == "mtp":
        cfg["num_draft"] = p.ttt_steps
    else:
        cfg.update(block_size=p.block_size, mask_token_id=tok.mask_id, target_layer_ids=layers)
    drafter = new_drafter(kind, target, **cfg)
    drafter.train()
    params = [q for q in drafter.parameters() if q.requires_grad]
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": p.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=p.lr, betas=(0.9, 0.95))
    total = p.steps[kind]
    calibrated = p.time_budget_s is None
    gen = torch.Generator().manual_seed(p.seed)
    ckpt = work / f"{kind}.ckpt.pt"
    step, elapsed, history, evals = 0, 0.0, [], []
    if resume and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed, history, evals = state["step"], state["elapsed"], state["history"], state["evals"]
        total, calibrated = state["total"], state["calibrated"]
        print(f"resumed {kind} from {ckpt} at step {step}")

    def save_ckpt() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": drafter.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "torch_rng": torch.get_rng_state(), "step": step, "elapsed": elapsed,
                    "history": history, "evals": evals, "total": total, "calibrated": calibrated,
                    "preset": asdict(p)}, tmp)
        tmp.replace(ckpt)

    sizes = torch.tensor([s for s, _ in p.block_mix])
    probs = torch.tensor([w for _, w in p.block_mix])
    recent: list[StepOut] = []
    bar = tqdm(total=total, initial=step, desc=f"train {kind}", dynamic_ncols=True)
    while step < total:
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, p)
        idx = torch.randint(0, len(data), (p.batch_size,), generator=gen).tolist()
        b = make_batch(data, feats, idx, kind)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if isinstance(drafter, MTPDrafter):
                out = mtp_loss(drafter, b, p.ttt_steps, p.ttt_decay)
            else:
                assert isinstance(drafter, DFlashDrafter)
                blk = int(sizes[torch.multinomial(probs, 1, generator=gen)])
                anchors, keep = sample_anchors(b, p.anchors, gen)
                out = block_loss(drafter, b, anchors, keep, blk)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        elapsed += time.perf_counter() - t0
        if not calibrated and step >= p.calibrate_at and p.time_budget_s is not None:
            # evaluation passes cost about 4% of the budget; the rest goes to steps
            total = max(step, min(total, int(0.96 * p.time_budget_s / (elapsed / step))))
            calibrated = True
            bar.total = total
            bar.refresh()
        recent = (recent + [StepOut(out.loss.detach(), out.correct, out.valid)])[-20:]
        m = summarize(recent)
        bar.set_postfix(loss=f"{out.loss.item():.3f}", acc1=f"{m['acc'][0] if m['acc'] else 0:.3f}", tau=f"{m['tau']:.2f}")
        bar.update(1)
        if step % 10 == 0 or step == total:
            history.append({"step": step, "loss": round(out.loss.item(), 4), "train_acc": m["acc"],
                            "train_tau": m["tau"], "elapsed_s": round(elapsed, 1)})
        if step % p.eval_every == 0 or step in (total // 2, total):
            ev = evaluate(drafter, held, held_feats, p)
            evals.append({"step": step, **ev})
            tqdm.write(f"{kind} step {step}: held-out " + ", ".join(f"{k} tau {v['mean_tau']}" for k, v in ev.items()))
        if step % p.ckpt_every == 0 or step in (total, stop_after):
            save_ckpt()
        if step == stop_after:
            bar.close()
            return {"summary": {"kind": kind, "stopped_at": step}}
    bar.close()

    if p.draft_vocab:
        from engines.training.draft_vocab import vocab_for

        drafter.set_draft_vocab(vocab_for(data, tok, target, p.draft_vocab))
    dest = save_drafter(drafter, out_dir / "drafters" / kind)
    final_eval = evals[-1] if evals else evaluate(drafter, held, held_feats, p)
    n_params = sum(q.numel() for q in drafter.parameters())
    summary = {
        "kind": kind, "preset": preset, "parameters": n_params,
        "file_mb": round((dest / "model.safetensors").stat().st_size / 2**20, 2),
        "train_seconds": round(elapsed, 1), "data_seconds": round(data_seconds, 1),
        "steps": step, "final_loss": history[-1]["loss"] if history else None,
        "train_acc": history[-1]["train_acc"] if history else [],
        "heldout": {k: v for k, v in final_eval.items() if k != "step"},
    }
    report = {
        "summary": summary,
        "recipe": {
            "data": {"source": "target's own greedy responses to train prompts (self-distillation)",
                     "sequences": len(data), "response_tokens": data.response_tokens(),
                     "per_domain": {dom: data.domains.count(dom) for dom in DOMAINS},
                     "generation_seconds": round(data.gen_seconds, 1),
                     "heldout_eval_sequences": len(held)},
            "target_layer_ids": layers if kind != "mtp" else [],
            "draft_vocab": int(drafter.draft_vocab.numel()) or target.config.vocab_size,
            "objective": (f"TTT, on-policy after step 0, step weights {p.ttt_decay:g}^s" if kind == "mtp"
                          else "random anchors, block+context mask, CE x exp(-(k-1)/(B/2))"
                          + ("; correction head teacher-forced" if kind == "dfly" else "")),
            "preset": asdict(replace(p, steps={kind: total})),
        },
        "history": history, "evals": evals,
    }
    (dest / f"train_{kind}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


# --- reporting ------------------------------------------------------------------------------------


def card_section(bundle: Path) -> str:
    """Markdown for `card.md`: each trained drafter's recipe and figures (from train_<kind>.json)."""
    lines = ["## Drafters", "",
             "Trained by `specroute train <kind> --preset demo` on the target's own greedy responses to "
             "train prompts (self-distillation); accuracy below is measured on the target's responses to "
             "held-out prompts (never trained on). tau = 1 + expected accepted drafts per step at T=0, "
             "bonus included, averaged over every response position; real decoding spends more of its steps "
             "at hard positions, so its mean accepted length per step (the acceptance table below) is lower.", ""]
    for kind in DRAFTERS:
        path = Path(bundle) / "drafters" / kind / f"train_{kind}.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text())
        s, rec = r["summary"], r["recipe"]
        pre = rec["preset"]
        lines += [f"### {kind}", "",
                  f"- {s['parameters'] / 1e6:.2f}M parameters ({s['file_mb']} MB bf16, target embedding/LM head shared); "
                  f"{pre['mtp_layers'] if kind == 'mtp' else pre['block_layers']} layer(s)"
                  + (f", target layers {rec['target_layer_ids']}" if rec["target_layer_ids"] else ""),
                  f"- objective: {rec['objective']}",
                  f"- data: {rec['data']['sequences']} sequences, {rec['data']['response_tokens']:,} response tokens "
                  f"({rec['data']['per_domain']})",
                  f"- {s['steps']} steps x batch {pre['batch_size']}, AdamW lr {pre['lr']} cosine, bf16 autocast, "
                  f"{s['train_seconds'] / 60:.1f} min on 2 CPU cores (+{s['data_seconds'] / 60:.1f} min data)", ""]
        lines += ["| setting | domain | tau | top-1 accuracy by position |", "|---|---|---|---|"]
        for setting, doms in s["heldout"].items():
            for dom, v in doms.items():
                if dom == "mean_tau":
                    continue
                acc = " ".join(f"{a:.2f}" for a in v["acc"])
                lines.append(f"| {setting} | {dom} | {v['tau']:.2f} | {acc} |")
            lines.append(f"| {setting} | **mean** | **{doms['mean_tau']:.2f}** | |")
        lines.append("")
    vocab = Path(bundle) / "drafters" / "draft_vocab.json"
    if vocab.is_file():
        v = json.loads(vocab.read_text())
        lines += ["### Draft vocabulary", "",
                  f"Drafters propose only the {v['size']} (of {v['vocab_size']}) tokens the target emits most "
                  f"often ({v['source']}; `specroute train draft-vocab`), through a bf16 copy of those LM-head rows. "
                  f"Held-out coverage of the target's response tokens: {v['heldout_coverage']:.2%} "
                  f"(by size: {', '.join(f'{n}: {c:.2%}' for n, c in v['heldout_coverage_by_size'].items())}). "
                  "Verification is unchanged, so outputs stay exactly the target's.", ""]
    return "\n".join(lines)


@torch.no_grad()
def evaluate_bundle(bundle: Path, preset: str = "demo", work_dir: Path | None = None,
                    kinds: tuple[str, ...] = tuple(DRAFTERS)) -> dict:
    """Held-out tau / accuracy of the bundle's trained drafters (reuses the cached held-out data)."""
    from engines.drafters.registry import load_drafter

    p = PRESETS[preset]
    torch.set_num_threads(p.threads)
    bundle = Path(bundle)
    target = load_model(bundle)
    freeze(target)
    tok = Tokenizer.load(bundle)
    L = target.config.num_hidden_layers
    layers = build_target_layer_ids(L, p.n_target_layers) if L > 3 else list(range(min(L, p.n_target_layers)))
    _, _, held, held_f = prepare_data(target, tok, p, Path(work_dir or bundle / ".work"), layers)
    out = {}
    for kind in kinds:
        if (bundle / "drafters" / kind / "config.json").is_file():
            out[kind] = evaluate(load_drafter(kind, bundle, target), held, held_f, p)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m engines.training.drafters {eval,card} --out models/demo`."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m engines.training.drafters")
    ap.add_argument("what", choices=("eval", "card"))
    ap.add_argument("--out", type=Path, default=Path("models/demo"))
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.what == "card":
        print(card_section(args.out))
    else:
        work = args.work or Path(".cache") / "train" / args.out.name
        print(json.dumps(evaluate_bundle(args.out, args.preset, work), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
