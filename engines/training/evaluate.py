"""Accuracy proxies of a drafter on held-out text: per-position top-1 accuracy and tau = 1 +
E[accepted drafts] at T=0 (the leading run of correct drafts plus the bonus token). For block
drafters and on-policy chain drafters this is exactly what greedy speculative decoding accepts on
the same text. With the target as teacher, also the expected acceptance of drafts sampled from q at
T=1 per position (1 - TV(p, q)) and tau_t1 = 1 + E[sum_k prod_{j<=k} accept_j]: a proxy of the
sampled-drafts acceptance at T=1 (it scores the greedy held-out text, not text sampled at T=1)."""

from __future__ import annotations

from pathlib import Path

import torch

from engines.drafters.base import Drafter
from engines.drafters.config import default_target_layers
from engines.drafters.layers import freeze
from engines.drafters.registry import DRAFTERS, load_drafter
from engines.model import load_model
from engines.tokenizer import Tokenizer
from engines.training.batch import make_batch, prepare_data
from engines.training.data import DOMAINS
from engines.training.distill import DistillSet, Features
from engines.training.losses import StepOut, objective_for
from engines.training.optim import train_autocast
from engines.training.recipe import PRESETS, DrafterPreset

EVAL_BATCH = 8


def summarize(outs: list[StepOut]) -> dict:
    """Per-position top-1 accuracy and tau = 1 + E[leading run of correct drafts]."""
    if not outs:
        return {"acc": [], "tau": 1.0, "n": 0}
    K = max(o.correct.shape[1] for o in outs)
    acc_n, acc_d, soft_n = torch.zeros(K), torch.zeros(K), torch.zeros(K)
    run_sum, soft_run, n = 0.0, 0.0, 0
    soft = all(o.accept is not None for o in outs)
    for o in outs:
        k = o.correct.shape[1]
        ok = o.correct & o.valid
        acc_n[:k] += ok.sum(0).float()
        acc_d[:k] += o.valid.sum(0).float()
        run_sum += float(ok.long().cumprod(1).sum())
        n += o.correct.shape[0]
        if soft and o.accept is not None:
            a = o.accept.float() * o.valid
            soft_n[:k] += a.sum(0)
            soft_run += float(a.cumprod(1).sum())
    acc = (acc_n / acc_d.clamp(min=1)).tolist()
    res = {"acc": [round(a, 4) for a in acc], "tau": round(1 + run_sum / max(n, 1), 4), "n": n}
    if soft:
        res["accept_t1"] = [round(a, 4) for a in (soft_n / acc_d.clamp(min=1)).tolist()]
        res["tau_t1"] = round(1 + soft_run / max(n, 1), 4)
    return res


@torch.no_grad()
def evaluate(d: Drafter, data: DistillSet, feats: Features, p: DrafterPreset) -> dict:
    """Per setting and domain: tau and per-position accuracy on `data` (held-out prompts' target
    responses), and the mean tau over domains."""
    d.eval()
    objective = objective_for(type(d))
    res: dict = {}
    for key, setting in objective.eval_settings(p).items():
        per_dom: dict[str, list[StepOut]] = {dom: [] for dom in DOMAINS}
        for dom in DOMAINS:
            rows = [i for i in range(len(data)) if data.domains[i] == dom]
            for c in range(0, len(rows), EVAL_BATCH):
                b = make_batch(data, feats, rows[c:c + EVAL_BATCH], d, teacher=True)
                with train_autocast():
                    per_dom[dom] += objective.eval_outs(d, b, setting, p)
        res[key] = {dom: summarize(o) for dom, o in per_dom.items() if o}
        taus = [v["tau"] for v in res[key].values()]
        res[key]["mean_tau"] = round(sum(taus) / max(len(taus), 1), 4)
        soft = [v["tau_t1"] for v in res[key].values() if isinstance(v, dict) and "tau_t1" in v]
        if soft:
            res[key]["mean_tau_t1"] = round(sum(soft) / len(soft), 4)
    d.train()
    return res


@torch.no_grad()
def evaluate_bundle(bundle: Path, preset: str = "demo", work_dir: Path | None = None,
                    kinds: tuple[str, ...] | None = None) -> dict:
    """Held-out tau / accuracy of the bundle's trained drafters (reuses the cached held-out data)."""
    p = PRESETS[preset]
    torch.set_num_threads(p.threads)
    bundle = Path(bundle)
    target = load_model(bundle)
    freeze(target)
    tok = Tokenizer.load(bundle)
    layers = default_target_layers(target.config.num_hidden_layers, p.n_target_layers)
    _, _, held, held_f = prepare_data(target, tok, p, Path(work_dir or bundle / ".work"), layers)
    out = {}
    for kind in kinds or tuple(DRAFTERS):
        if (bundle / "drafters" / kind / "config.json").is_file():
            out[kind] = evaluate(load_drafter(kind, bundle, target), held, held_f, p)
    return out
