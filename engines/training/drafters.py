"""Train a drafter against the bundle's target: `specroute train <kind>` (any registered kind).

1. Self-distillation data (`engines.training.batch`, `distill`): the target's greedy responses to
   TRAIN prompts (balanced chat/code/math), plus responses sampled at T=0.8 for a share of them,
   and its features (captured layers + final hidden), generated once and cached under the work
   directory for every drafter. Held-out prompts are only
   used to *report* accuracy (no gradient, no checkpoint selection).
2. The loss of the drafter's family (`Drafter.objective`, `engines.training.losses`), on response
   positions only: chain drafters (MTP) unroll their chain (training-time test), block drafters
   (DFlash, DFly) score anchored blocks; each position's term is the recipe's objective against the
   target (`losses.soft`: KL / TV / LK to its full distribution at the training temperatures, or CE).
3. bf16 autocast, AdamW, warmup + cosine, tqdm progress (loss, top-1 accuracy, tau), checkpoints
   with resume (model, optimiser, step, RNG), fixed seed (`engines.training.optim`).
4. Output: `OUT/drafters/<kind>/{config.json,model.safetensors,train_<kind>.json}`
   (`engines.training.report`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from engines.drafters.base import Drafter
from engines.drafters.config import default_target_layers
from engines.drafters.layers import freeze
from engines.drafters.registry import drafter_class, new_drafter, save_drafter
from engines.model import load_model
from engines.tokenizer import Tokenizer
from engines.training.batch import bucketed_batch, make_batch, prepare_data
from engines.training.distill import DistillSet, Features
from engines.training.evaluate import evaluate, evaluate_bundle, summarize
from engines.training.losses import StepOut, objective_for
from engines.training.optim import adamw, lr_at, optimizer_step, save_checkpoint, train_autocast
from engines.training.recipe import DrafterPreset, resolve_preset
from engines.training.report import Progress, card_section, training_report
from specroute.errors import UserError


class Run:
    """One drafter's training: model, optimiser, data, RNG and progress (all checkpointed)."""

    def __init__(self, drafter: Drafter, p: DrafterPreset, data: tuple[DistillSet, Features],
                 held: tuple[DistillSet, Features], ckpt: Path) -> None:
        self.drafter, self.p, self.ckpt = drafter, p, ckpt
        self.data, self.held = data, held
        self.objective = objective_for(type(drafter))
        self.params = [q for q in drafter.parameters() if q.requires_grad]
        self.opt = adamw(self.params, p)
        self.gen = torch.Generator().manual_seed(p.seed)
        self.progress = Progress(total=p.steps, calibrated=p.time_budget_s is None)
        self.recent: list[StepOut] = []

    def save(self) -> None:
        save_checkpoint(self.ckpt, {"model": self.drafter.state_dict(), "opt": self.opt.state_dict(),
                                    "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
                                    **asdict(self.progress), "preset": asdict(self.p)})

    def restore(self) -> None:
        state = torch.load(self.ckpt, weights_only=False)
        self.drafter.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        self.progress = Progress(**{k: state[k] for k in asdict(self.progress)})
        if self.p.time_budget_s is None and self.p.steps != self.progress.total:
            # a step cap given on resume replaces the checkpoint's (the cosine decay follows the new end)
            self.progress.total = max(self.progress.step, self.p.steps)
        print(f"resumed {self.drafter.kind} from {self.ckpt} at step {self.progress.step} of {self.progress.total}")

    def step(self) -> StepOut:
        """One optimiser step on a random batch."""
        p, run = self.p, self.progress
        t0 = time.perf_counter()
        data, feats = self.data
        idx = bucketed_batch([len(t) for t in data.tokens], p.batch_size, self.gen)
        b = make_batch(data, feats, idx, self.drafter, teacher=p.loss != "ce")
        with train_autocast():
            out = self.objective.train_loss(self.drafter, b, p, self.gen)
        optimizer_step(self.opt, self.params, out.loss, lr_at(run.step, run.total, p))
        run.step += 1
        run.elapsed += time.perf_counter() - t0
        if not run.calibrated and run.step >= p.calibrate_at and p.time_budget_s is not None:
            # evaluation passes cost about 4% of the budget; the rest goes to steps
            run.total = max(run.step, min(run.total, int(0.96 * p.time_budget_s / (run.elapsed / run.step))))
            run.calibrated = True
        self.recent = (self.recent + [StepOut(out.loss.detach(), out.correct, out.valid, accept=out.accept)])[-20:]
        return out

    def evaluate(self) -> dict:
        return evaluate(self.drafter, *self.held, self.p)

    def fit(self, stop_after: int | None = None) -> bool:
        """Train to the end (True) or until step `stop_after` (False), checkpointing on the way."""
        p, run, kind = self.p, self.progress, self.drafter.kind
        bar = tqdm(total=run.total, initial=run.step, desc=f"train {kind}", dynamic_ncols=True)
        while run.step < run.total:
            out = self.step()
            bar.total = run.total
            m = summarize(self.recent)
            bar.set_postfix(loss=f"{out.loss.item():.3f}", acc1=f"{m['acc'][0] if m['acc'] else 0:.3f}",
                            tau=f"{m['tau']:.2f}", **({"tau_t1": f"{m['tau_t1']:.2f}"} if "tau_t1" in m else {}))
            bar.update(1)
            if run.step % 10 == 0 or run.step == run.total:
                run.history.append({"step": run.step, "loss": round(out.loss.item(), 4), "train_acc": m["acc"],
                                    "train_tau": m["tau"], "elapsed_s": round(run.elapsed, 1),
                                    **({"train_tau_t1": m["tau_t1"]} if "tau_t1" in m else {})})
            if run.step % p.eval_every == 0 or run.step in (run.total // 2, run.total):
                ev = self.evaluate()
                run.evals.append({"step": run.step, **ev})
                tqdm.write(f"{kind} step {run.step}: held-out "
                           + ", ".join(f"{k} tau {v['mean_tau']}" for k, v in ev.items()))
            if run.step % p.ckpt_every == 0 or run.step in (run.total, stop_after):
                self.save()
            if run.step == stop_after:
                bar.close()
                return False
        bar.close()
        return True


def train_drafter(kind: str, out_dir: Path, preset: str = "demo", work_dir: Path | None = None,
                  resume: bool = True, stop_after: int | None = None, budget_s: float | None = None,
                  max_steps: int | None = None, init_from: Path | None = None, export: bool = False,
                  **overrides: object) -> dict:
    """Train `kind` for the bundle in `out_dir`; `stop_after` ends this run early at that step (after
    a checkpoint), as an interruption would; a later call resumes. `budget_s` / `max_steps` override
    the preset's wall-time budget and step cap, `overrides` other recipe fields (`loss`, ...).
    `init_from`: a bundle whose trained `kind` drafter (same shape) the run starts from instead of a
    fresh initialisation (fine-tuning an existing drafter on a new objective or data mix).
    `export`: write the drafter as its last checkpoint left it, without training further (a run cut
    short ships what it has; its report records the steps taken, and a later call resumes the run)."""
    objective = objective_for(drafter_class(kind))
    p = resolve_preset(preset, budget_s, max_steps, **overrides)
    out_dir = Path(out_dir)
    if not (out_dir / "model.safetensors").is_file():
        raise UserError(f"no target model in {out_dir}: run `specroute train target --out {out_dir}` first")
    work = Path(work_dir or out_dir / ".work")
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(p.threads)
    torch.manual_seed(p.seed)
    t_start = time.perf_counter()
    target, tok = load_model(out_dir), Tokenizer.load(out_dir)
    freeze(target)
    layers = default_target_layers(target.config.num_hidden_layers, p.n_target_layers)
    data, feats, held, held_feats = prepare_data(target, tok, p, work, layers,
                                                 out_dir / "selfdistill" if p.keep_data else None)
    data_seconds = time.perf_counter() - t_start
    if not len(data):
        raise UserError("no training prompts fit the preset's prompt length")

    drafter = new_drafter(kind, target, **objective.drafter_config(p, tok.mask_id, layers)).train()
    warm = None
    if init_from is not None:
        warm = warm_start(drafter, Path(init_from), target)
    vocab = None
    if p.draft_vocab:
        from engines.training.draft_vocab import vocab_for

        vocab = vocab_for(data, tok, target, p.draft_vocab)
        if p.train_in_draft_vocab:
            drafter.set_train_vocab(vocab)
    run = Run(drafter, p, (data, feats), (held, held_feats), work / f"{kind}.ckpt.pt")
    if resume and run.ckpt.is_file():
        run.restore()
    elif export:
        raise UserError(f"--export: no checkpoint at {run.ckpt}")
    if not export and not run.fit(stop_after):
        return {"summary": {"kind": kind, "stopped_at": run.progress.step}}

    drafter.set_train_vocab(None)
    if vocab is not None:
        drafter.set_draft_vocab(vocab)
    dest = save_drafter(drafter, out_dir / "drafters" / kind)
    last = run.progress.evals[-1] if run.progress.evals else None
    final_eval = last if last is not None and last["step"] == run.progress.step else run.evaluate()
    report = training_report(drafter, preset, p, run.progress, final_eval, dest, data, held, data_seconds,
                             init_from=warm)
    (dest / f"train_{kind}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def warm_start(drafter: Drafter, bundle: Path, target: torch.nn.Module) -> dict:
    """Copy the weights of `bundle`'s trained drafter of the same kind (the draft vocabulary is not
    copied: training sets its own); -> {bundle, steps it had been trained for (None if unrecorded)}."""
    from engines.drafters.registry import load_drafter

    src = load_drafter(drafter.kind, bundle, drafter.target)
    state = {k: v for k, v in src.state_dict().items() if k != "draft_vocab"}
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if [k for k in missing if k != "draft_vocab"] or unexpected:
        raise UserError(f"{bundle}: its {drafter.kind} drafter does not match this recipe's shape")
    print(f"{drafter.kind}: starting from the drafter in {bundle}")
    report = bundle / "drafters" / drafter.kind / f"train_{drafter.kind}.json"
    here = Path.cwd().resolve()   # the start is recorded as the command would name it from the checkout
    name = str(bundle.resolve().relative_to(here)) if bundle.resolve().is_relative_to(here) else str(bundle)
    if not report.is_file():
        return {"bundle": name, "steps": None}
    prior = json.loads(report.read_text())
    steps = prior["summary"].get("steps")  # its own run plus the runs it continued, if any
    earlier = (prior.get("recipe", {}).get("init_from") or {}).get("steps")
    return {"bundle": name, "steps": None if steps is None else steps + (earlier or 0)}


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
