"""Render `card.md` for a bundle from the reports its training commands wrote.

Sources: `train_target.json` (target), `drafters/<kind>/train_<kind>.json` (drafters), the decode
step timings measured here, and a few greedy sample completions per domain on held-out prompts.
Nothing in the card is typed by hand.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from engines.drafters.registry import DRAFTERS
from engines.generate import ar_generate
from engines.model import KVCache, Transformer, load_model
from engines.sampling import SamplingParams
from engines.tokenizer import Tokenizer
from engines.training.data import DOMAINS, load_prompts

DEMO_FLAGS = {"mtp": "--budget 1500 --steps 2400"}   # how models/demo's first MTP run differs from the preset


def drafter_preset(bundle: Path, kind: str) -> str:
    """The preset that reproduces the bundle's `kind` drafter: `demo-ce` for one trained before the
    soft objective existed (its recorded recipe has no `loss`, or CE), else `demo`."""
    path = Path(bundle) / "drafters" / kind / f"train_{kind}.json"
    if not path.is_file():
        return "demo"
    recipe = json.loads(path.read_text()).get("recipe", {}).get("preset", {})
    return "demo-ce" if recipe.get("loss", "ce") == "ce" else "demo"


def reproduce_lines(bundle: Path, kind: str) -> list[str]:
    """The `specroute train` command(s) behind the bundle's `kind` drafter: one run, or a first run
    (`demo-ce`, the recipe every first drafter shipped with) and the run that continued it
    (`--init-from`, with the steps each recorded)."""
    line = f"specroute train {kind} --preset {drafter_preset(bundle, kind)}"
    path = Path(bundle) / "drafters" / kind / f"train_{kind}.json"
    rep = json.loads(path.read_text()) if path.is_file() else {}
    prior = (rep.get("recipe", {}).get("init_from") or {})
    if not prior:
        return [f"{line} {DEMO_FLAGS.get(kind, '')}".rstrip() + " --out models/demo"]
    first = DEMO_FLAGS.get(kind) or (f"--steps {prior['steps']}" if prior.get("steps") else "")
    return [f"specroute train {kind} --preset demo-ce {first}".rstrip() + " --out models/demo",
            f"{line} --init-from models/demo --steps {rep['summary']['steps']} --out models/demo   # continues it"]


@torch.no_grad()
def decode_step_ms(model: Transformer, tokens_per_step: int, batch: int = 1, prompt: int = 128,
                   reps: int = 21) -> float:
    """Median wall time of one cached forward (+ LM head) of `tokens_per_step` tokens per row."""
    cfg = model.config
    cache = KVCache.for_model(cfg, batch, prompt + tokens_per_step + 1)
    slots = torch.arange(batch)
    g = torch.Generator().manual_seed(0)
    model(torch.randint(0, cfg.vocab_size, (batch, prompt), generator=g),
          torch.arange(prompt).expand(batch, prompt), cache, slots)
    toks = torch.randint(0, cfg.vocab_size, (batch, tokens_per_step), generator=g)
    pos = (prompt + torch.arange(tokens_per_step)).expand(batch, tokens_per_step)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.logits(model(toks, pos, cache, slots).hidden)
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[reps // 2]


def sample_completions(model: Transformer, tok: Tokenizer, per_domain: int = 2,
                       max_tokens: int = 80) -> dict[str, list[tuple[str, str]]]:
    prompts = load_prompts("heldout")
    out: dict[str, list[tuple[str, str]]] = {}
    for d in DOMAINS:
        picked = [p for p in prompts if p.domain == d and len(p.prompt) < 300][:per_domain]
        out[d] = []
        for p in picked:
            ids = tok.encode_chat([{"role": "user", "content": p.prompt}])
            res = ar_generate(model, tok, ids, SamplingParams(), max_tokens=max_tokens)
            out[d].append((p.prompt, res.text))
    return out


def _fence(text: str) -> str:
    return "```text\n" + text.replace("```", "ʼʼʼ").strip() + "\n```"


def imported_reproduce_lines(bundle: Path) -> list[str]:
    """The commands behind an imported bundle: the import, then each drafter's `specroute train` run
    as its `train_<kind>.json` recorded it (preset, steps, threads, and where they differ from the
    preset: prompts per domain and peak learning rate; a run that continued another drafter names it)."""
    from engines.training.recipe import PRESETS

    src = json.loads((bundle / "source.json").read_text())["source"]
    lines = [f"specroute model import {src} --out {bundle}   # make import"]
    for kind in DRAFTERS:
        path = bundle / "drafters" / kind / f"train_{kind}.json"
        if path.is_file():
            rep = json.loads(path.read_text())
            name, recipe = rep["summary"]["preset"], rep["recipe"]
            used, base = recipe["preset"], PRESETS.get(name)
            flags = [f"--steps {rep['summary']['steps']}"]
            if used.get("threads", 2) != 2:
                flags.append(f"--threads {used['threads']}")
            for field, flag in (("per_domain", "--per-domain"), ("lr", "--lr")):
                if base is not None and field in used and used[field] != getattr(base, field):
                    flags.append(f"{flag} {used[field]:g}")
            prior = recipe.get("init_from") or {}
            note = ""
            if prior:   # the start as the run recorded it (`drafters.warm_start`: named from the checkout)
                flags.insert(0, f"--init-from {prior.get('bundle') or bundle}")
                note = f"   # continues a drafter trained {prior.get('steps', '?')} steps"
            lines.append(f"specroute train {kind} --preset {name} {' '.join(flags)} --out {bundle}{note}")
    return lines


def imported_target_lines(bundle: Path, cfg: dict, model: Transformer, timings: dict[int, float]) -> list[str]:
    """The card's head for a target imported by `specroute model import` (`source.json`): what it is,
    where it came from, how to rebuild the bundle, and how its decode step costs here."""
    src = json.loads((bundle / "source.json").read_text())
    parity = bundle.resolve().parent.parent / "bench" / "results" / bundle.name / "parity.json"
    lines = [
        f"# {bundle.name} bundle",
        "",
        f"A pretrained target imported by `specroute model import` from `{src['source']}` ({src['bytes'] / 1e6:.0f} MB, "
        f"sha256 `{src['sha256'][:16]}…`), dequantised to fp32, with drafters trained for it on this machine by "
        "specroute's own pipeline. Only the drafters and their training token sequences (`selfdistill/`) are "
        "committed; `make import` writes the target's weights and tokenizer.",
        "",
        "## Reproduce",
        "",
        "```bash",
        *imported_reproduce_lines(bundle),
        f"specroute train card --out {bundle}      # this file",
        "```",
        "",
        "## Target",
        "",
        f"- Architecture: Llama (RMSNorm, RoPE theta {cfg.get('rope_theta', 10000):g}, SwiGLU, GQA), "
        f"{cfg['num_hidden_layers']} layers, width {cfg['hidden_size']}, MLP {cfg['intermediate_size']}, "
        f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, vocabulary {cfg['vocab_size']}, "
        f"context {cfg['max_position_embeddings']}, {'tied' if cfg.get('tie_word_embeddings') else 'untied'} "
        f"embeddings; {model.num_parameters() / 1e6:.1f}M parameters.",
    ]
    if parity.is_file():
        rows = json.loads(parity.read_text())
        summary = rows.get("summary", rows)
        same, n = summary.get("identical"), summary.get("prompts")
        if same is not None and n is not None:
            lines.append(f"- Parity with transformers (`bench/results/{bundle.name}/parity.json`): greedy output "
                         f"token-identical on {same} of {n} held-out prompts.")
    lines += ["",
              f"Decode step at batch 1 (prompt 128, fp32, {torch.get_num_threads()} threads, median of 21): 1 token "
              f"{timings[1]:.1f} ms, 8 tokens {timings[8]:.1f} ms, 16 tokens {timings[16]:.1f} ms.", ""]
    return lines


def render_card(bundle: Path) -> str:
    torch.set_num_threads(2)
    cfg = json.loads((bundle / "config.json").read_text())
    model = load_model(bundle)
    tok = Tokenizer.load(bundle)
    timings = {k: decode_step_ms(model, k) for k in (1, 8, 16)}
    results = bundle.resolve().parent.parent / "bench" / "results"
    if (bundle / "source.json").is_file():
        lines = imported_target_lines(bundle, cfg, model, timings)
        return "\n".join(tail_lines(bundle, model, tok, lines, results / bundle.name / "acceptance.json"))
    rep = json.loads((bundle / "train_target.json").read_text())
    size_mb = sum(f.stat().st_size for f in bundle.rglob("*.safetensors")) / 1e6
    p = rep["config"]
    lines = [
        "# demo bundle",
        "",
        "A small Llama-style target and its drafters, trained from scratch on this machine by specroute's own",
        "pipeline. `transformers` loads it directly (`AutoModelForCausalLM`, `AutoTokenizer`).",
        "",
        "## Reproduce",
        "",
        "```bash",
        "specroute train tokenizer --out models/demo",
        "specroute train target --preset demo --out models/demo",
        *[line for k in DRAFTERS for line in reproduce_lines(bundle, k)],
        "specroute train draft-vocab --size 2048 --out models/demo",
        "specroute train card --out models/demo      # this file",
        "```",
        "",
        "## Target",
        "",
        f"- Architecture: Llama (RMSNorm, RoPE, SwiGLU, GQA), {cfg['num_hidden_layers']} layers, width "
        f"{cfg['hidden_size']}, MLP {cfg['intermediate_size']}, {cfg['num_attention_heads']} heads / "
        f"{cfg['num_key_value_heads']} KV head(s), vocabulary {cfg['vocab_size']} (byte-level BPE), context "
        f"{cfg['max_position_embeddings']}, tied embeddings; {rep['parameters'] / 1e6:.1f}M parameters.",
        f"- Training: {rep['tokens_seen'] / 1e6:.2f}M tokens ({p['steps']} steps x {p['batch_size']} x "
        f"{p['seq_len']}), AdamW lr {p['lr']} cosine to {p['min_lr']}, warmup {p['warmup']}, bf16 autocast, "
        f"2 threads, seed {p['seed']}: **{rep['train_seconds'] / 60:.1f} minutes** on "
        f"{platform.machine()} ({torch.get_num_threads()} threads).",
        f"- Data mix per training row (chat / code / math): {' / '.join(str(w) for w in p['domain_weights'])}. "
        "Chat: the shared prose and dialogue corpus (conversations rewritten into the chat template) and the "
        "chat prompts' references as chat turns; code: Python standard-library source plus 'write this "
        "documented function' chat pairs built from it, and the code prompts' reference solutions; math: "
        "gsm8k / MATH / AQuA worked solutions as chat turns and the math-educators Q&A. 10% of every source "
        "(hash of the item id) is held out.",
        "- Token streams (train): " + ", ".join(f"{d} {n / 1e6:.2f}M" for d, n in rep["token_streams"]["train"].items()) + ".",
        "",
        "| held-out perplexity | " + " | ".join(DOMAINS) + " |",
        "|---|" + "---|" * len(DOMAINS),
        "| target | " + " | ".join(f"{rep['heldout_perplexity'][d]:.2f}" for d in DOMAINS) + " |",
        "",
        f"Decode step at batch 1 (prompt 128, fp32, 2 threads, median of 21): 1 token {timings[1]:.1f} ms, "
        f"8 tokens {timings[8]:.1f} ms, 16 tokens {timings[16]:.1f} ms.",
        "",
        f"Bundle size (all safetensors, bf16): {size_mb:.1f} MB.",
        "",
    ]
    return "\n".join(tail_lines(bundle, model, tok, lines, results / "acceptance.json"))


def tail_lines(bundle: Path, model: Transformer, tok: Tokenizer, lines: list[str], acceptance: Path) -> list[str]:
    """What every card ends with: the drafters' training figures, the acceptance table of `acceptance`
    (when the checkout has it) and greedy sample completions."""
    if (bundle / "drafters").is_dir() and any((bundle / "drafters").glob("*/train_*.json")):
        from engines.training.report import card_section

        lines += [card_section(bundle), ""]
    lines += acceptance_section(acceptance)
    lines += ["## Sample completions (greedy, held-out prompts)", ""]
    for d, pairs in sample_completions(model, tok).items():
        lines += [f"### {d}", ""]
        for prompt, text in pairs:
            lines += ["Prompt:", "", _fence(prompt), "", "Completion:", "", _fence(text), ""]
    return lines


def acceptance_section(path: Path) -> list[str]:
    """`specroute bench acceptance`'s table, drafter x domain x temperature (when the bundle sits in a
    checkout that has it); at T > 0 the rows with drafts sampled from q (the engine's default)."""
    if not path.is_file():
        return []
    rows = [r for r in json.loads(path.read_text()).get("rows", [])
            if r.get("temperature") == 0 or r.get("drafting", "sampled") == "sampled"]
    if not rows:
        return []
    temps = sorted({float(r["temperature"]) for r in rows})
    cells: dict[tuple[str, str], dict[float, dict]] = {}
    for r in rows:
        name = DRAFTERS[r["drafter"]].label(r["k"]) if r["drafter"] in DRAFTERS else r["drafter"]
        cells.setdefault((name, r["domain"]), {})[float(r["temperature"])] = r
    name = "/".join(path.parts[path.parts.index("results") + 1:]) if "results" in path.parts else path.name
    out = [f"## Acceptance on held-out prompts (`bench/results/{name}`, batch 1)", "",
           "Mean accepted length per verification step (bonus included) / decode speedup over AR at the same "
           "temperature in the same run (median over prompts). At T > 0 drafts are sampled from the drafter's q. "
           "Lossless: outputs token-identical to AR at T=0.", "",
           "| drafter | domain | " + " | ".join(f"T={t:g}" for t in temps) + " | lossless (T=0) |",
           "|---|---|" + "---|" * len(temps) + "---|"]
    for (name, domain), by_t in cells.items():
        vals = [f"{by_t[t]['mean_accepted_length']:.2f} / {by_t[t]['speedup']:.2f}x" if t in by_t else "-"
                for t in temps]
        r0 = by_t.get(0.0)
        lossless = f"{r0['lossless_checked'] - r0['lossless_mismatches']}/{r0['lossless_checked']}" if r0 else "-"
        out.append(f"| {name} | {domain} | " + " | ".join(vals) + f" | {lossless} |")
    return [*out, ""]


def write_card(bundle: Path) -> Path:
    path = bundle / "card.md"
    path.write_text(render_card(bundle))
    return path
