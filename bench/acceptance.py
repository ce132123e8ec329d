"""`specroute bench acceptance`: acceptance and speed of every drafter per domain and temperature.

Per drafter configuration (autoregressive ones at k=3 or their maximum, a tree's k its depth; block
drafters at blocks 8, 16), domain (chat, code, math; held-out prompts) and temperature (0, 0.7, 1;
same prompts), batch 1, drafts sampled from q at T > 0 by default (`--no-sample-drafts`: greedy):

- mean accepted length per verification step, bonus token included (vLLM's convention),
- per-position acceptance rates (steps accepting draft i / steps),
- draft and verify milliseconds per step,
- decode tokens/s of the speculative loop and of plain AR decoding, measured in the same run and
  interleaved per prompt (medians over prompts), and the speedup,
- at temperature 0, a losslessness check of every output against AR greedy decoding (near-ties
  tolerated only as `engines.lossless.check_lossless` defines them);
- at temperature > 0, an exactness figure: the chi-square p-value of the first three tokens' histogram
  against plain decoding's (`bench.exactness`, `--exactness-samples` draws each);
- with `--schema`, rows under a JSON schema beside the unconstrained ones (`constraint` "json_schema",
  temperature 0): the same prompts asking for a JSON answer, every path held to the schema's grammar
  (`engines.grammar`), each output compared token by token with AR's constrained greedy output.

Rows whose mean accepted length is under 1.3 are flagged: a drafter that loads but accepts almost
nothing is a bug. Writes `acceptance.json` and `acceptance.png` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from pydantic import BaseModel

from bench.exactness import first_tokens, homogeneity_p
from engines.dcut.profile import cpu_name
from engines.drafters.base import Drafter
from engines.drafters.registry import DRAFTERS, load_drafter
from engines.generate import GenerationResult, ar_generate
from engines.grammar import Constraint, GrammarCompiler
from engines.lossless import check_lossless
from engines.model import Transformer, load_model
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from engines.spec_generate import spec_generate
from engines.tokenizer import Tokenizer
from specroute.contracts.grammar import GrammarSpec
from specroute.contracts.stats import AcceptanceStats
from specroute.errors import UserError

DOMAINS = ("chat", "code", "math")
LOW_ACCEPTANCE = 1.3
# the schema of `--schema` rows, and the request the prompts carry for it
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}
SCHEMA_ASK = '\n\nReply with a JSON object of the form {"answer": "..."} and nothing else.'


class AcceptanceRow(BaseModel):
    drafter: str
    block: int                      # tokens per step at most (drafts + 1); MTP: k + 1
    k: int                          # drafts proposed and verified per step
    domain: str
    temperature: float
    prompts: int
    tokens: int                     # generated tokens (speculative loop)
    steps: int                      # verification steps
    mean_accepted_length: float     # (steps + accepted drafts) / steps
    acceptance_per_position: list[float]
    draft_ms: float                 # mean per step
    verify_ms: float                # mean per step
    tokens_per_s: float             # median over prompts of decode tokens/s (after the first token)
    ar_tokens_per_s: float
    speedup: float                  # tokens_per_s / ar_tokens_per_s (medians over prompts)
    speedup_mean: float = 0.0       # mean over prompts of decode tokens/s, spec / AR (Spec-Bench's convention)
    speedup_aggregate: float = 0.0  # all decode tokens / all decode seconds, spec / AR (token-weighted)
    lossless_checked: int           # prompts compared token by token with AR greedy (T=0 only)
    lossless_mismatches: int        # differences not explained by a near-tie (bugs)
    near_ties: int                  # differences at a tolerated near-tie
    low_acceptance: bool            # mean_accepted_length < 1.3: flagged
    drafting: str = "greedy"        # "greedy" (q one-hot) or "sampled" (drafts sampled from q; T > 0 only)
    # T > 0 only: chi-square homogeneity p-value of the first three tokens of the domain's first prompt,
    # drawn `exactness_samples` times through this drafter and as many times by plain decoding (`bench.exactness`)
    exactness_p: float | None = None
    exactness_samples: int = 0
    constraint: str = "none"        # "json_schema": the prompts ask for JSON and decoding follows SCHEMA


class AcceptanceReport(BaseModel):
    meta: dict
    rows: list[AcceptanceRow]


@dataclass
class Config:
    kind: str
    block: int
    k: int


def label(kind: str, k: int) -> str:
    """`mtp k=3`, `dfly b16`: the drafter's own label for k drafts a step."""
    return DRAFTERS[kind].label(k)


@dataclass
class Acc:
    """Accumulated measurements of one (temperature, domain, drafter) cell."""
    prompts: int = 0
    tokens: int = 0
    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)
    draft_s: float = 0.0
    verify_s: float = 0.0
    tps: list[float] = field(default_factory=list)
    ar_tps: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # tokens, s (spec), tokens, s (AR)
    checked: int = 0
    mismatches: int = 0
    near_ties: int = 0

    def add(self, res: GenerationResult, ar: GenerationResult, draft_s: float, verify_s: float) -> None:
        self.prompts += 1
        self.tokens += res.stats.completion_tokens
        self.acceptance = self.acceptance.merge(res.stats.acceptance)
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.tps.append(decode_tps(res))
        self.ar_tps.append(decode_tps(ar))
        for i, r in enumerate((res.stats, ar.stats)):
            self.decode[2 * i] += max(r.completion_tokens - 1, 0)
            self.decode[2 * i + 1] += max(r.wall_s - r.ttft_s, 0.0)

    def speedups(self) -> tuple[float, float]:
        """(ratio of mean per-prompt tokens/s, ratio of token-weighted tokens/s)."""
        def mean(xs: list[float]) -> float:
            xs = [x for x in xs if x == x]
            return sum(xs) / len(xs) if xs else 0.0

        m_spec, m_ar = mean(self.tps), mean(self.ar_tps)
        t, s, at, as_ = self.decode
        agg = (t / s) / (at / as_) if s > 0 and as_ > 0 and at > 0 else 0.0
        return (round(m_spec / m_ar, 3) if m_ar else 0.0), round(agg, 3)


def decode_tps(res: GenerationResult) -> float:
    """Tokens/s of the decode loop: tokens after the first over the time after the first."""
    s = res.stats
    t = s.wall_s - s.ttft_s
    return (s.completion_tokens - 1) / t if s.completion_tokens > 1 and t > 0 else float("nan")


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else 0.0


def select_prompts(tok: Tokenizer, n: int, max_prompt_tokens: int, seed: int,
                   suffix: str = "") -> dict[str, list[list[int]]]:
    """n held-out prompts per domain (deterministic shuffle), chat-templated with `suffix` after the
    user's text, at most max_prompt_tokens."""
    from engines.training.data import load_prompts

    items = load_prompts("heldout")
    rng = random.Random(seed)
    rng.shuffle(items)
    out: dict[str, list[list[int]]] = {d: [] for d in DOMAINS}
    for p in items:
        if p.domain in out and len(out[p.domain]) < n:
            ids = tok.encode_chat([{"role": "user", "content": p.prompt + suffix}])
            if len(ids) <= max_prompt_tokens:
                out[p.domain].append(ids)
    for d, ps in out.items():
        if len(ps) < n:
            print(f"acceptance: only {len(ps)} held-out {d} prompts fit (wanted {n})", file=sys.stderr)
    return out


def load_configs(model_dir: Path, target: Transformer, kinds: list[str], blocks: list[int],
                 mtp_k: int) -> list[tuple[Config, Drafter]]:
    """One config per autoregressive drafter (k = `mtp_k` at most) and per block size of the others."""
    out = []
    for kind in kinds:
        if not (model_dir / "drafters" / kind / "config.json").is_file():
            print(f"acceptance: no {kind} drafter in {model_dir}/drafters/{kind}: skipped", file=sys.stderr)
            continue
        if kind in DRAFTERS and DRAFTERS[kind].autoregressive:
            d = load_drafter(kind, model_dir, target)
            k = min(mtp_k, d.max_draft)
            out.append((Config(kind, k + 1, k), d))
        else:
            for b in blocks:
                d = load_drafter(kind, model_dir, target, block_size=b)
                out.append((Config(kind, b, d.max_draft), d))
    if not out:
        raise UserError(f"no drafters found under {model_dir}/drafters/ (train them first)")
    return out


@dataclass(frozen=True)
class Cell:
    """One (temperature, domain, constraint) cell: its prompts, and a fresh grammar state per request
    (`constrain`, None when unconstrained)."""
    temperature: float
    domain: str
    prompts: list[list[int]]
    constraint: str = "none"
    constrain: Callable[[], Constraint] | None = None


def run(target: Transformer, tok: Tokenizer, configs: list[tuple[Config, Drafter]],
        prompts: dict[str, list[list[int]]], temperatures: list[float], max_tokens: int,
        prompts_hot: int, seed: int, log=print, domains: tuple[str, ...] = DOMAINS,
        time_budget_s: float | None = None, sample_drafts: bool = True,
        exactness_samples: int = 0, schema_prompts: dict[str, list[list[int]]] | None = None,
        constrain: Callable[[], Constraint] | None = None) -> list[AcceptanceRow]:
    """Every (temperature, domain) cell, then with `schema_prompts` a temperature-0 cell per domain under
    `constrain`'s grammar; with a time budget, each cell gets an equal share and stops taking new prompts
    when its share is spent (the rows report how many prompts were measured)."""
    cells = [Cell(t, d, prompts[d] if t == 0 else prompts[d][:prompts_hot]) for t in temperatures for d in domains]
    if schema_prompts is not None:
        cells += [Cell(0.0, d, schema_prompts[d], "json_schema", constrain) for d in domains]
    max_len = target.config.max_position_embeddings
    decoders = [SpecDecoder(target, d, 1, max_len, sample_drafts=sample_drafts) for _, d in configs]
    share = time_budget_s / len(cells) if time_budget_s else None
    rows: list[AcceptanceRow] = []
    for cell in cells:
        t0 = time.perf_counter()
        accs = measure_cell(target, tok, configs, decoders, cell, max_tokens, seed, log, share)
        exact: list[float | None] = [None] * len(configs)
        if cell.temperature > 0 and exactness_samples and cell.prompts:
            exact = exactness(target, configs, cell, exactness_samples, seed, sample_drafts)
            decoders = [SpecDecoder(target, d, 1, max_len, sample_drafts=sample_drafts) for _, d in configs]
        for (cfg, _), a, p_exact in zip(configs, accs, exact, strict=True):
            row = make_row(cfg, cell, a, p_exact, exactness_samples, sample_drafts)
            rows.append(row)
            flag = "  <-- LOW ACCEPTANCE" if row.low_acceptance else ""
            log(f"T={cell.temperature:g} {cell.domain:<4} {label(cfg.kind, cfg.k):<10} "
                + ("json " if cell.constrain else "") + f"tau={row.mean_accepted_length:.2f} "
                f"tok/s={row.tokens_per_s:.1f} (ar {row.ar_tokens_per_s:.1f}) x{row.speedup:.2f} "
                f"(mean x{row.speedup_mean:.2f}, aggregate x{row.speedup_aggregate:.2f}) "
                f"draft={row.draft_ms:.1f}ms verify={row.verify_ms:.1f}ms "
                f"lossless {row.lossless_checked - row.lossless_mismatches}/{row.lossless_checked}"
                + (f" exactness p={row.exactness_p:.3f}" if row.exactness_p is not None else "") + flag)
        log(f"  ({accs[0].prompts} prompts in {time.perf_counter() - t0:.0f}s)")
    return rows


def measure_cell(target: Transformer, tok: Tokenizer, configs: list[tuple[Config, Drafter]],
                 decoders: list[SpecDecoder], cell: Cell, max_tokens: int, seed: int, log,
                 share: float | None) -> list[Acc]:
    """Each prompt of the cell decoded by AR and by every config (their order rotated per prompt to
    spread drift); at temperature 0 each output is checked against AR's: under a grammar token for
    token (AR's constrained greedy output), else with `check_lossless`'s near-tie rule."""
    max_len = target.config.max_position_embeddings
    accs = [Acc() for _ in configs]
    t0 = time.perf_counter()
    for i, ids in enumerate(cell.prompts):
        if share is not None and i and time.perf_counter() - t0 > share:
            log(f"  time budget: stopped after {i} of {len(cell.prompts)} prompts")
            break
        torch.manual_seed(seed + i)   # unseeded rows (a seeded one drafts greedily): their generators
        params = SamplingParams(temperature=cell.temperature)
        grammar = cell.constrain
        ar = ar_generate(target, tok, ids, params, max_tokens=max_tokens, max_len=max_len,
                         constraint=grammar() if grammar else None)
        order = list(range(len(configs)))
        for j in order[i % len(order):] + order[:i % len(order)]:
            cfg, dec = configs[j][0], decoders[j]
            d0, v0 = dec.timing.draft_s, dec.timing.verify_s
            res = spec_generate(target, None, tok, ids, params, max_tokens=max_tokens, k=cfg.k, decoder=dec,
                                constraint=grammar() if grammar else None)
            accs[j].add(res, ar, dec.timing.draft_s - d0, dec.timing.verify_s - v0)
            if cell.temperature != 0:
                continue
            if grammar:
                ok, tie, reason = res.token_ids == ar.token_ids, False, "differs from AR's constrained output"
            else:
                chk = check_lossless(target, ids, res.token_ids, ar.token_ids)
                ok, tie, reason = chk.ok, chk.ok and not chk.identical, chk.reason
            accs[j].checked += 1
            accs[j].mismatches += 0 if ok else 1
            accs[j].near_ties += 1 if tie else 0
            if not ok:
                log(f"  LOSSLESS MISMATCH {label(cfg.kind, cfg.k)} {cell.domain} prompt {i}: {reason}")
    return accs


def exactness(target: Transformer, configs: list[tuple[Config, Drafter]], cell: Cell, samples: int, seed: int,
              sample_drafts: bool) -> list[float | None]:
    """Per config, the homogeneity p-value of the first three tokens of the cell's first prompt drawn
    `samples` times through it against as many plain draws (`bench.exactness`)."""
    max_len = target.config.max_position_embeddings
    prompt = cell.prompts[0]
    hot, room = SamplingParams(temperature=cell.temperature), min(max_len, len(prompt) + 8)   # 3 tokens, no more
    ar = first_tokens(SpecDecoder(target, None, 50, room), prompt, hot, samples, 0, seed=seed)
    out: list[float | None] = []
    for cfg, d in configs:
        got = first_tokens(SpecDecoder(target, d, 50, room, sample_drafts=sample_drafts), prompt, hot,
                           samples, cfg.k, seed=seed + 1)
        out.append(round(homogeneity_p(got, ar), 4))
    return out


def make_row(cfg: Config, cell: Cell, a: Acc, p_exact: float | None, exactness_samples: int,
             sample_drafts: bool) -> AcceptanceRow:
    steps, mal = a.acceptance.steps, a.acceptance.mean_accepted_length
    tps, ar_tps = _median(a.tps), _median(a.ar_tps)
    return AcceptanceRow(
        drafter=cfg.kind, block=cfg.block, k=cfg.k, domain=cell.domain, temperature=cell.temperature,
        prompts=a.prompts, tokens=a.tokens, steps=steps, mean_accepted_length=round(mal, 4),
        acceptance_per_position=[round(x, 4) for x in a.acceptance.acceptance_per_position()],
        draft_ms=round(1e3 * a.draft_s / max(steps, 1), 3), verify_ms=round(1e3 * a.verify_s / max(steps, 1), 3),
        tokens_per_s=round(tps, 2), ar_tokens_per_s=round(ar_tps, 2),
        speedup=round(tps / ar_tps, 3) if ar_tps else 0.0,
        speedup_mean=a.speedups()[0], speedup_aggregate=a.speedups()[1],
        lossless_checked=a.checked, lossless_mismatches=a.mismatches, near_ties=a.near_ties,
        low_acceptance=mal < LOW_ACCEPTANCE,
        drafting="sampled" if sample_drafts and cell.temperature > 0 else "greedy",
        exactness_p=p_exact, exactness_samples=exactness_samples if p_exact is not None else 0,
        constraint=cell.constraint,
    )


def plot(report: AcceptanceReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.rows
    cols = sorted({(r.temperature, r.drafting) for r in rows})
    domains = [d for d in DOMAINS if any(r.domain == d for r in rows)]
    labels = list(dict.fromkeys(label(r.drafter, r.k) for r in rows))
    fig, axes = plt.subplots(3, len(cols), figsize=(6.5 * len(cols), 12), squeeze=False)
    colors = plt.get_cmap("tab10")
    width = 0.8 / max(len(labels), 1)
    for c, (temp, drafting) in enumerate(cols):
        sub = [r for r in rows if r.temperature == temp and r.drafting == drafting]
        name = f"T={temp:g}" + (f", {drafting} drafts" if temp > 0 else "")
        for metric, ax, ref, title in (
            ("mean_accepted_length", axes[0][c], LOW_ACCEPTANCE, "mean accepted length (tokens/step, incl. bonus)"),
            ("speedup", axes[1][c], 1.0, "decode speedup over AR (same run, batch 1)"),
        ):
            for j, lab in enumerate(labels):
                found = [next((r for r in sub if r.domain == d and label(r.drafter, r.k) == lab),
                              None) for d in domains]
                vals = [getattr(r, metric) if r else 0.0 for r in found]
                xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(domains))]
                bars = ax.bar(xs, vals, width, label=lab, color=colors(j))
                for bar, r in zip(bars, found, strict=True):   # flagged rows: hatched
                    if r is not None and r.low_acceptance:
                        bar.set_hatch("xx")
                        bar.set_edgecolor("black")
                ax.bar_label(bars, fmt="%.2f", fontsize=7)
            ax.axhline(ref, color="red", ls="--", lw=1,
                       label=f"flag < {LOW_ACCEPTANCE}" if metric == "mean_accepted_length" else "AR")
            ax.set_xticks(range(len(domains)), domains)
            ax.set_title(f"{name}: {title}", fontsize=10)
            ax.set_ylim(0, max([getattr(r, metric) for r in sub] + [ref]) * 1.25)
            ax.legend(fontsize=7, ncols=3, loc="upper left")
        ax = axes[2][c]
        for j, lab in enumerate(labels):
            rs = [r for r in sub if label(r.drafter, r.k) == lab]
            if not rs:
                continue
            n = max(len(r.acceptance_per_position) for r in rs)
            mean = [statistics.mean(r.acceptance_per_position[i] if i < len(r.acceptance_per_position) else 0.0
                                    for r in rs) for i in range(n)]
            ax.plot(range(1, n + 1), mean, marker="o", ms=3, label=lab, color=colors(j))
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name}: acceptance rate per draft position (mean over domains)", fontsize=10)
        ax.legend(fontsize=7)
    meta = report.meta
    fig.suptitle(f"Speculative decoding on held-out prompts ({meta.get('model', '')}, batch 1, "
                 f"{meta.get('max_tokens')} tokens, {meta.get('threads')} CPU threads; hatched = flagged, "
                 f"mean accepted length < {LOW_ACCEPTANCE})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench acceptance", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--out", default="bench/results/")
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help="comma list (default: every registered kind)")
    ap.add_argument("--blocks", default="8,16", help="block sizes for the block drafters")
    ap.add_argument("--mtp-k", type=int, default=3, help="autoregressive drafters' k (capped at each one's max)")
    ap.add_argument("--prompts", type=int, default=60, help="prompts per domain at temperature 0")
    ap.add_argument("--prompts-hot", type=int, default=None,
                    help="prompts per domain at temperature > 0 (default: --prompts)")
    ap.add_argument("--temperatures", default="0,0.7,1")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--domains", default=",".join(DOMAINS))
    ap.add_argument("--sample-drafts", action=argparse.BooleanOptionalAction, default=True,
                    help="at temperature > 0, drafters sample drafts from q (default; --no-sample-drafts: greedy)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds for the whole run; each (temperature, domain) cell gets an equal share")
    ap.add_argument("--exactness-samples", type=int, default=400,
                    help="at temperature > 0: draws of the first three tokens per drafter and per domain for "
                         "the exactness p-value against plain decoding (0: skip)")
    ap.add_argument("--schema", action=argparse.BooleanOptionalAction, default=False,
                    help="also temperature-0 rows under a JSON schema (the same prompts asking for JSON)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="combine acceptance.json files of partial runs (e.g. one per domain) into --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        return write_report(merge_reports([Path(p) for p in args.merge]), out)
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    try:
        kinds = [k for k in args.drafters.split(",") if k]
        blocks = [int(b) for b in args.blocks.split(",") if b]
        temps = [float(t) for t in args.temperatures.split(",") if t]
    except ValueError as exc:
        raise UserError(f"bad list option: {exc}") from None
    domains = tuple(d for d in args.domains.split(",") if d)
    if unknown := [d for d in domains if d not in DOMAINS]:
        raise UserError(f"unknown domain(s) {', '.join(unknown)} (have {', '.join(DOMAINS)})")
    if args.prompts < 1 or args.max_tokens < 1:
        raise UserError("--prompts and --max-tokens must be >= 1")
    target = load_model(model_dir)
    tok = Tokenizer.load(model_dir)
    configs = load_configs(model_dir, target, kinds, blocks, args.mtp_k)
    prompts = select_prompts(tok, args.prompts, args.max_prompt_tokens, args.seed)
    hot = args.prompts_hot if args.prompts_hot is not None else args.prompts
    schema_prompts, constrain = None, None
    if args.schema:
        schema_prompts = select_prompts(tok, args.prompts, args.max_prompt_tokens, args.seed, SCHEMA_ASK)
        compiler = GrammarCompiler(tok.inner.to_str(), target.config.vocab_size, tok.eos_id)
        spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
        constrain = partial(compiler.constraint, spec)
    t0 = time.perf_counter()
    rows = run(target, tok, configs, prompts, temps, args.max_tokens, hot, args.seed,
               log=lambda s: print(s, file=sys.stderr, flush=True), domains=domains,
               time_budget_s=args.time_budget, sample_drafts=args.sample_drafts,
               exactness_samples=args.exactness_samples, schema_prompts=schema_prompts, constrain=constrain)
    report = AcceptanceReport(meta={
        "model": str(model_dir), "max_tokens": args.max_tokens, "threads": args.threads,
        "prompt_split": "held-out (specroute.contracts.split.is_heldout), chat template",
        "batch_size": 1, "torch": torch.__version__, "seed": args.seed,
        "drafting_at_t_gt_0": "sampled from q" if args.sample_drafts else "greedy (q one-hot)",
        "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "mean_accepted_length": "(steps + accepted drafts) / steps, bonus token included (vLLM convention)",
        "tokens_per_s": "median over prompts of decode tokens/s after the first token; AR measured in the "
                        "same run, interleaved per prompt",
        "speedup": "median spec tokens/s / median AR tokens/s; speedup_mean: the same with means over prompts "
                   "(Spec-Bench's convention); speedup_aggregate: all decode tokens / all decode seconds "
                   "(token-weighted: long, hard-to-draft outputs weigh more)",
        "lossless": "temperature 0 only: token-exact vs AR greedy, near-ties (<1e-4 logit gap) tolerated",
        "exactness_p": "temperature > 0: chi-square homogeneity p-value of the first three tokens of each "
                       "domain's first prompt, drafter vs plain decoding, exactness_samples draws each "
                       "(small p: a difference detected; the exact checks are `pytest -m exactness`)",
        "constraint": f"json_schema rows: prompts + {SCHEMA_ASK.strip()!r}, decoding held to {json.dumps(SCHEMA)}, "
                      "lossless = token-identical to AR's constrained greedy output",
        "low_acceptance_threshold": LOW_ACCEPTANCE,
        "wall_s": round(time.perf_counter() - t0, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }, rows=rows)
    return write_report(report, out)


def merge_reports(paths: list[Path]) -> AcceptanceReport:
    reports = []
    for p in paths:
        try:
            reports.append(AcceptanceReport.model_validate_json(p.read_text()))
        except (OSError, ValueError) as exc:
            raise UserError(f"{p}: not an acceptance report ({str(exc).splitlines()[0]})") from None
    if not reports:
        raise UserError("--merge needs at least one file")
    order = {d: i for i, d in enumerate(DOMAINS)}
    for rep in reports:   # reports written before rows carried `drafting`: take it from the meta
        if str(rep.meta.get("drafting_at_t_gt_0", "")).startswith("sampled"):
            for r in rep.rows:
                r.drafting = "sampled" if r.temperature > 0 else "greedy"
    rows = sorted((r for rep in reports for r in rep.rows),
                  key=lambda r: (r.constraint, r.temperature, r.drafting, order.get(r.domain, 9), r.drafter, r.block))
    meta = dict(reports[0].meta)
    meta["merged_from"] = [str(p) for p in paths]
    meta.pop("drafting_at_t_gt_0", None)
    meta["drafting"] = "per row: greedy (q one-hot) or sampled from q (T > 0)"
    meta["wall_s"] = max(float(rep.meta.get("wall_s", 0)) for rep in reports)
    return AcceptanceReport(meta=meta, rows=rows)


def write_report(report: AcceptanceReport, out: Path) -> int:
    rows = report.rows
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "acceptance.json.tmp"
    tmp.write_text(json.dumps(report.model_dump(), indent=2) + "\n")
    tmp.replace(out / "acceptance.json")
    plot(report, out / "acceptance.png")
    flagged = [r for r in rows if r.low_acceptance]
    bad = sum(r.lossless_mismatches for r in rows)
    print(f"wrote {out / 'acceptance.json'} and {out / 'acceptance.png'} ({len(rows)} rows, "
          f"{len(flagged)} flagged under {LOW_ACCEPTANCE}, {bad} lossless mismatches)")
    return 1 if bad else 0
