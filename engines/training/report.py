"""What a drafter training run records: its progress (checkpointed), `train_<kind>.json` (summary,
recipe, history, held-out evaluations) and the card section rendered from those files."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines.drafters.base import Drafter
from engines.drafters.registry import DRAFTERS
from engines.training.data import DOMAINS
from engines.training.distill import REFERENCE, DistillSet
from engines.training.losses import objective_for
from engines.training.optim import precision
from engines.training.recipe import DrafterPreset


@dataclass
class Progress:
    """A run so far; checkpoints store these fields (flat) and the report quotes them."""

    total: int                   # steps this run will take (fixed by the time budget once calibrated)
    calibrated: bool
    step: int = 0
    elapsed: float = 0.0         # training seconds (data generation excluded)
    history: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)


def training_report(d: Drafter, preset: str, p: DrafterPreset, run: Progress, final_eval: dict, dest: Path,
                    data: DistillSet, held: DistillSet, data_seconds: float, init_from: dict | None = None) -> dict:
    """`train_<kind>.json`; `init_from`: the bundle and step count of the drafter this run started from."""
    last = run.history[-1] if run.history else {}
    summary = {
        "kind": d.kind, "preset": preset, "parameters": sum(q.numel() for q in d.parameters()),
        "file_mb": round((dest / "model.safetensors").stat().st_size / 2**20, 2),
        "train_seconds": round(run.elapsed, 1), "data_seconds": round(data_seconds, 1),
        "steps": run.step, "final_loss": last.get("loss"), "train_acc": last.get("train_acc", []),
        "precision": precision(),
        "heldout": {k: v for k, v in final_eval.items() if k != "step"},
    }
    objective = objective_for(type(d))
    recipe = {
        "data": {"source": data_source(data),
                 "sequences": len(data), "response_tokens": data.response_tokens(),
                 "per_domain": {dom: data.domains.count(dom) for dom in DOMAINS},
                 "generation_seconds": round(data.gen_seconds, 1),
                 "heldout_eval_sequences": len(held)},
        "target_layer_ids": list(d.capture_layers),
        "draft_vocab": int(d.draft_vocab.numel()) or d.target.config.vocab_size,
        "objective": "; ".join(filter(None, (objective.describe(p), d.objective_note))),
        "preset": {**asdict(p), "steps": {d.kind: run.total}},
    }
    if init_from is not None:
        recipe["init_from"] = init_from
    return {"summary": summary, "recipe": recipe, "history": run.history, "evals": run.evals}


def data_source(data: DistillSet) -> str:
    """What the training text is: greedy responses, and how many sampled ones at which temperature."""
    temps = [data.temperature(i) for i in range(len(data))]
    sampled = {t: temps.count(t) for t in sorted(set(temps)) if t > 0}
    extra = "".join(f" + {n} responses sampled at T={t:g}" for t, n in sampled.items())
    refs = temps.count(REFERENCE)
    if refs:
        extra += f" + {refs} sources' reference answers read teacher-forced"
    return f"target's own greedy responses to train prompts{extra} (self-distillation)"


def card_section(bundle: Path) -> str:
    """Markdown for `card.md`: each trained drafter's recipe and figures (from train_<kind>.json)."""
    lines = ["## Drafters", "",
             "Trained by `specroute train <kind>` (the commands are under Reproduce) on the target's own responses to train "
             "prompts (self-distillation; each drafter's data line says greedy and/or sampled); accuracy "
             "below is measured on the target's greedy responses to held-out prompts (never trained on). "
             "tau = 1 + expected accepted drafts per step at T=0, bonus included, averaged over every "
             "response position; tau T=1 is the same with drafts sampled from the drafter at T=1 (expected "
             "acceptance 1 - TV(p, q) per position, on the same greedy text: a proxy). Real decoding spends "
             "more of its steps at hard positions, so its mean accepted length per step (the acceptance "
             "table below) is lower.", ""]
    for kind, cls in DRAFTERS.items():
        path = Path(bundle) / "drafters" / kind / f"train_{kind}.json"
        if path.is_file():
            lines += drafter_lines(kind, json.loads(path.read_text()), objective_for(cls).layers_field)
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


def drafter_lines(kind: str, report: dict, layers_field: str) -> list[str]:
    """One drafter's card section from its `train_<kind>.json`."""
    s, rec = report["summary"], report["recipe"]
    pre = rec["preset"]
    lines = [f"### {kind}", "",
             f"- {s['parameters'] / 1e6:.2f}M parameters ({s['file_mb']} MB bf16, target embedding/LM head shared); "
             f"{pre[layers_field]} layer(s)"
             + (f", target layers {rec['target_layer_ids']}" if rec["target_layer_ids"] else ""),
             f"- objective: {rec['objective']}",
             f"- data: {rec['data']['sequences']} sequences, {rec['data']['response_tokens']:,} response tokens "
             f"({rec['data']['per_domain']})",
             f"- {s['steps']} steps x batch {pre['batch_size']}, AdamW lr {pre['lr']} cosine, "
             f"{s.get('precision', 'bf16 autocast')}, "
             f"{s['train_seconds'] / 60:.1f} min on {_threads(pre.get('threads', 2))} (+{s['data_seconds'] / 60:.1f} "
             f"min data){_continued(kind, rec.get('init_from'), s['steps'])}", ""]
    lines += ["| setting | domain | tau | tau T=1 | top-1 accuracy by position |", "|---|---|---|---|---|"]
    for setting, doms in s["heldout"].items():
        for dom, v in doms.items():
            if dom.startswith("mean_"):
                continue
            acc = " ".join(f"{a:.2f}" for a in v["acc"])
            t1 = f"{v['tau_t1']:.2f}" if "tau_t1" in v else "-"
            lines.append(f"| {setting} | {dom} | {v['tau']:.2f} | {t1} | {acc} |")
        t1 = f"**{doms['mean_tau_t1']:.2f}**" if "mean_tau_t1" in doms else "-"
        lines.append(f"| {setting} | **mean** | **{doms['mean_tau']:.2f}** | {t1} | |")
    return [*lines, ""]


def _threads(n: int) -> str:
    return f"{n} torch thread{'s' if n != 1 else ''}"


def _continued(kind: str, init: dict | None, steps: int) -> str:
    """', continuing ...' for a run that started from a trained drafter (`--init-from`)."""
    if not init:
        return ""
    before = init.get("steps")
    if before is None:
        return f", starting from the {kind} drafter of {init['bundle']}"
    return f", continuing the {before} steps of the {kind} drafter of {init['bundle']} ({before + steps} steps in all)"
