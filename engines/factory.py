"""Building an engine from its kind and a model bundle, and a batcher over it.

The one factory behind `specroute generate`, the gRPC worker and the benchmarks:

    engine = load_engine("dfly", "models/demo", block_size=16)    # target + tokenizer + drafter
    engine = load_engine("mtp,dfly,ar", "models/demo")            # several modes over one target
    decoder = new_decoder(engine, num_slots=1)                    # SpecDecoder (its KV cache)
    batcher = make_batcher(engine, BatcherConfig(max_running=32), dcut=True).start()

Engine kinds are `engines.drafters.registry.engine_kinds()`: "ar" plus one per drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engines.batcher import Batcher
from engines.dcut.controller import DcutController
from engines.drafters.base import Drafter
from engines.drafters.registry import DRAFTERS, engine_kinds, load_drafter
from engines.errors import BundleMismatch, EngineError, UnknownEngine
from engines.model import Transformer, load_model
from engines.requests import BatcherConfig, BatcherObserver
from engines.spec import SpecDecoder
from engines.tokenizer import Tokenizer

DCUT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)   # profiled up to the batcher's max_running


@dataclass
class LoadedEngine:
    """A target model, its tokenizer and (for speculative kinds) the drafter, from one bundle; a
    multi-mode engine ("mtp,dfly,ar") has one drafter per mode over the same target (`modes`)."""

    kind: str                        # "ar" or a drafter kind: the (default) mode
    target: Transformer
    tokenizer: Tokenizer
    drafter: Drafter | None          # the default mode's; None for "ar"
    model_dir: Path
    modes: dict[str, Drafter | None] = field(default_factory=dict)   # every mode (default first)

    def __post_init__(self) -> None:
        if not self.modes:
            self.modes = {self.kind: self.drafter}

    @property
    def multi(self) -> bool:
        return len(self.modes) > 1

    @property
    def block_size(self) -> int:
        """Most draft tokens one step proposes (0 without a drafter): the default mode's."""
        return int(self.drafter.max_draft) if self.drafter is not None else 0

    def mode_block_size(self, mode: str) -> int:
        d = self.modes[mode]
        return int(d.max_draft) if d is not None else 0

    @property
    def max_context(self) -> int:
        return int(self.target.config.max_position_embeddings)

    @property
    def eos_ids(self) -> list[int]:
        return sorted({*getattr(self.target.config, "eos_ids", ()), self.tokenizer.eos_id})


def parse_modes(kind: str) -> list[str]:
    """"mtp" -> ["mtp"]; "mtp,dfly,ar" -> every mode, the default first. Raises `UnknownEngine`."""
    kinds = [k.strip() for k in kind.split(",")]
    for k in kinds:
        if k not in engine_kinds():
            raise UnknownEngine(f"unknown engine {k!r} (expected one of {', '.join(engine_kinds())}, "
                                "or several of them separated by commas)")
    if len(set(kinds)) != len(kinds):
        raise UnknownEngine(f"engine {kind!r} names a mode twice")
    return kinds


def load_engine(kind: str, model_dir: str | Path, block_size: int | None = None) -> LoadedEngine:
    """Load the target, tokenizer and (for a drafter kind) the drafter from `model_dir`; block drafters
    run at `block_size` when given. `kind` may name several modes ("mtp,dfly,ar"): one target, one
    drafter per mode, the first the default. Raises `UnknownEngine` / `BundleMismatch` (and the
    loaders' `UserError`s for missing or malformed files)."""
    kinds = parse_modes(kind)
    model_dir = Path(model_dir)
    target = load_model(model_dir)
    tok = Tokenizer.load(model_dir)
    if tok.vocab_size > target.config.vocab_size:
        raise BundleMismatch(f"tokenizer has {tok.vocab_size} tokens but the model's vocabulary is "
                             f"{target.config.vocab_size}")
    modes = {k: load_drafter(k, model_dir, target, block_size).eval() if k in DRAFTERS else None for k in kinds}
    return LoadedEngine(kinds[0], target, tok, modes[kinds[0]], model_dir, modes)


def new_decoder(engine: LoadedEngine, num_slots: int, max_len: int | None = None, prefill_chunk: int = 256,
                sample_drafts: bool = True) -> SpecDecoder:
    """A `SpecDecoder` with `num_slots` cache slots of `max_len` tokens (default: the model's context)."""
    return SpecDecoder(engine.target, engine.drafter, num_slots, int(max_len or engine.max_context),
                       prefill_chunk=prefill_chunk, sample_drafts=sample_drafts,
                       modes=engine.modes if engine.multi else None)


def make_batcher(engine: LoadedEngine, config: BatcherConfig, dcut: bool = False, threads: int = 1,
                 profile_dir: str | Path | None = None, observer: BatcherObserver | None = None) -> Batcher:
    """A batcher over a fresh decoder (`config.max_running` slots of `config.max_len` tokens); with
    `dcut`, a D-Cut controller over this machine's cost profile (measured now unless cached)."""
    decoder = new_decoder(engine, config.max_running, config.max_len, config.prefill_chunk)
    controller = new_dcut(engine, decoder, config, threads, profile_dir) if dcut else None
    return Batcher(decoder, engine.tokenizer.decode, engine.eos_ids, config, controller, observer)


def new_dcut(engine: LoadedEngine, decoder: SpecDecoder, config: BatcherConfig, threads: int,
             profile_dir: str | Path | None = None) -> DcutController | None:
    """D-Cut for a batcher of `config` over `decoder` (None for AR, k = 0 or a drafter D-Cut does not
    apply to, such as a tree: nothing to cut)."""
    from engines.dcut.profile import load_or_profile

    k = engine.block_size if config.k is None else min(config.k, engine.block_size)
    if engine.multi:
        raise EngineError("D-Cut runs on a single-mode worker (the router chooses the mode per request here)")
    if engine.drafter is None or k <= 0 or not engine.drafter.supports_dcut:
        return None
    table = load_or_profile(engine.target, engine.model_dir, k, threads, cache_dir=profile_dir, decoder=decoder,
                            context=min(256, max(8, config.max_len // 2)),
                            capture=tuple(engine.drafter.capture_layers),
                            batch_sizes=tuple(b for b in DCUT_BATCH_SIZES if b <= max(config.max_running, 1)) or (1,))
    return DcutController(table, k)
