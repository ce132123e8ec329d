"""Worker settings: one object from the environment (`SPECROUTE_WORKER_*`) and CLI flags (cli.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engines.drafters.registry import engine_kinds

EXTERNAL_ENGINES = ("vllm", "null")   # vLLM's engine and the null test double
# the context a worker serves when `context_length` is unset: the model's max positions, at most this
# (every slot's KV cache is allocated up front: 32 slots x 8,192 positions of a 30-layer model is 12 GB)
DEFAULT_CONTEXT = 2048


def worker_engines() -> tuple[str, ...]:
    """Every `--engine` a worker accepts: ours (from the drafter registry, read at call time), then
    the external ones."""
    return (*engine_kinds(), *EXTERNAL_ENGINES)


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTE_WORKER_", extra="ignore")

    engine: str = "ar"                        # one kind, or several ("mtp,dfly,ar": modes over one target)
    model: Path | None = None                 # model bundle directory (optional only for `null`)
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535)   # Prometheus side port (None: off)
    max_running: int = Field(32, ge=1, le=1024)
    max_waiting: int = Field(128, ge=0)
    max_tokens_default: int = Field(256, ge=1)
    context_length: int | None = Field(None, ge=8)            # default: model's max positions, <= DEFAULT_CONTEXT
    block_size: int | None = Field(None, ge=2, le=33)         # block drafters: tokens per block (B; drafts B-1)
    k: int | None = Field(None, ge=0, le=32)                  # draft tokens per step (default: drafter max)
    prefill_chunk: int = Field(128, ge=1)
    prefill_budget: int = Field(256, ge=1)
    dcut: bool = False
    dcut_profile_dir: Path | None = None      # where dcut_profile.json goes if not next to the model
    redis_url: str | None = None              # feedback; None disables it
    pool: str = ""                            # pool name reported with feedback (default: engine kind)
    threads: int = Field(1, ge=1, le=256)     # torch intra-op threads
    drain_timeout_s: float = Field(30.0, ge=0)
    feedback_queue: int = Field(1000, ge=1)
    # drafter faults (engines/worker/degrade.py): degrade the drafter this long after start (None: never;
    # SIGUSR1 / SIGUSR2 degrade / restore at any time), by noise of this many weight standard deviations
    degrade_drafter_after_s: float | None = Field(None, ge=0)
    degrade_drafter_noise: float = Field(3.0, gt=0, le=100)
    degrade_mode: str | None = None           # which mode's drafter a multi-mode worker degrades (default: first)
    # null engine: output tokens per request when the request does not say (0: use max_tokens)
    null_text: str = "lorem ipsum dolor sit amet "
    null_token_delay_ms: float = Field(0.0, ge=0)
    # vLLM adapter
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_drafter: str | None = None           # dflash drafter checkpoint path / HF id
    vllm_method: str | None = None            # none | ngram | draft_model | mtp | dflash (default: dflash
                                              # with --vllm-drafter, else ngram)
    engine_arg: list[str] = Field(default_factory=list)   # vLLM AsyncEngineArgs as key=value (JSON values)
    engine_args_file: Path | None = None      # the same as one JSON object (--engine-arg wins)

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        kinds = [k.strip() for k in v.split(",")]
        for k in kinds:
            if k not in worker_engines():
                raise ValueError(f"unknown engine {k!r} (expected one of {', '.join(worker_engines())}, "
                                 "or several of ours separated by commas)")
        if len(kinds) > 1 and any(k in EXTERNAL_ENGINES for k in kinds):
            raise ValueError(f"{v!r}: only our own engines combine into modes over one target")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"{v!r} names a mode twice")
        return ",".join(kinds)

    @property
    def modes(self) -> list[str]:
        """The engine modes this worker serves (the first is the default)."""
        return self.engine.split(",")

    @model_validator(mode="after")
    def _needs_model(self) -> WorkerSettings:
        if self.engine != "null" and self.model is None:
            raise ValueError(f"--model is required for engine {self.engine!r}")
        if len(self.modes) > 1 and self.dcut:
            raise ValueError("--dcut runs on a single-mode worker (with several modes the router picks the mode)")
        if self.degrade_mode is not None and self.degrade_mode not in self.modes:
            raise ValueError(f"--degrade-mode {self.degrade_mode!r} is not one of this worker's modes")
        if not self.pool:
            self.pool = self.engine.replace(",", "+") + ("-dcut" if self.dcut else "")
        return self

    @property
    def draft_k(self) -> int | None:
        """Draft tokens per step asked for: --k, else block size - 1."""
        if self.k is not None:
            return self.k
        return self.block_size - 1 if self.block_size else None
