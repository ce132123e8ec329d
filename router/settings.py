"""Gateway settings: one object, from the environment (`SPECROUTE_*`) and CLI flags (router/cli.py).

Static process configuration only; the live routing policy is a separate document in Redis.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from router.keys.ring import MIN_SECRET_CHARS, NAME_PATTERN, KeyLimits, parse_limits
from router.workers.discovery import is_dns, parse_dns


def spec_or_json(value: str, seps: str = ";") -> Any:
    """A setting given as JSON (`{...}`) -> the parsed object; else its compact `NAME=VALUE` parts
    (split at any of `seps`, empty parts dropped) -> [(part, name, value)], name and value stripped,
    value None where the part has no `=`."""
    text = value.strip()
    if text.startswith("{"):
        return json.loads(text)
    for sep in seps[1:]:
        text = text.replace(sep, seps[0])
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(seps[0]))):
        name, eq, rest = part.partition("=")
        out.append((part, name.strip(), rest.strip() if eq else None))
    return out


def parse_pools(value: Any) -> dict[str, list[str]]:
    """`{"mtp": ["host:port", ...]}` or the compact `mtp=h:p,h:p;dfly=h:p` form; a member
    `dns:///host:port` stands for every address the name resolves to (router/workers/discovery.py)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        parsed = spec_or_json(value)
        if isinstance(parsed, list):
            out: dict[str, list[str]] = {}
            for part, name, addrs in parsed:
                if addrs is None or not name:
                    raise ValueError(f"pool spec {part!r} must look like NAME=HOST:PORT[,HOST:PORT...]")
                out.setdefault(name, []).extend(a.strip() for a in addrs.split(",") if a.strip())
            parsed = out
        value = parsed
    if not isinstance(value, dict):
        raise ValueError("pools must be a mapping of pool name to endpoint list")
    pools: dict[str, list[str]] = {}
    for name, addrs in value.items():
        if isinstance(addrs, str):
            addrs = [a.strip() for a in addrs.split(",") if a.strip()]
        if not addrs:
            raise ValueError(f"pool {name!r} has no endpoints")
        for a in addrs:
            if is_dns(str(a)):
                parse_dns(str(name), str(a))
                continue
            host, _, port = str(a).rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"pool {name!r}: endpoint {a!r} must be HOST:PORT")
        pools[str(name)] = [str(a) for a in addrs]
    return pools


def parse_pool_modes(value: Any) -> dict[str, str]:
    """`{"dfly": "dfly"}` or the compact `dfly=dfly;mtp=mtp` form (`,` separates too): the engine mode
    the gateway asks of a pool's workers (`GenerateRequest.mode`), for workers that serve several
    modes over one target (`specroute worker --engine mtp,dfly,ar`)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        parsed = spec_or_json(value, ";,")
        if isinstance(parsed, list):
            for part, name, mode in parsed:
                if not name or not mode:
                    raise ValueError(f"pool mode {part!r} must look like NAME=MODE")
            parsed = {name: mode for _, name, mode in parsed}
        value = parsed
    if not isinstance(value, dict):
        raise ValueError("pool modes must be a mapping of pool name to engine mode")
    return {str(k): str(v) for k, v in value.items()}


def token_name(token: str) -> str:
    """The name an unnamed token is known by (audit actor, logs): a short fingerprint, so two
    unnamed tokens stay apart and neither is revealed."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]


def parse_keys(value: Any) -> dict[str, str]:
    """API or admin tokens: `token`, `name:token`, comma separated (or a JSON mapping name -> token).
    An unnamed token is named by its fingerprint (`token_name`). Refused (`ValueError`, at startup): a
    token shorter than `MIN_SECRET_CHARS`, an item with `:` whose name part is not a key name
    (`NAME_PATTERN`: an unnamed token may not contain `:`), and two names with one token."""
    if value is None or value == "":
        return {}
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, dict):
        return check_keys({str(k): str(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        items = [str(v) for v in value]
    else:
        text = str(value).strip()
        if text.startswith("{"):
            return check_keys({str(k): str(v) for k, v in json.loads(text).items()})
        items = [t for t in (x.strip() for x in text.split(",")) if t]
    out: dict[str, str] = {}
    for item in items:
        name, sep, token = item.partition(":")
        if not sep:
            out[token_name(item)] = item
        elif re.match(NAME_PATTERN, name) and token:
            out[name] = token
        else:
            raise ValueError("a token containing ':' must be `name:token` with a name of letters, digits, "
                             "'.', '_' or '-' (an unnamed token may not contain ':')")
    return check_keys(out)


def check_keys(keys: dict[str, str]) -> dict[str, str]:
    """`keys` when every token is long enough and no two names share one, else `ValueError`."""
    for name, token in keys.items():
        if len(token) < MIN_SECRET_CHARS:
            raise ValueError(f"token {name!r} is shorter than {MIN_SECRET_CHARS} characters")
    if len(set(keys.values())) < len(keys):
        raise ValueError("two token names share one token")
    return keys


def read_secret_file(path: Path, what: str) -> str:
    """The token(s) in a file (kept out of argv, where `ps` shows them to every user)."""
    try:
        lines = [x.strip() for x in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not any(lines):
        raise ValueError(f"the {what} file {path} is empty")
    return ",".join(x for x in lines if x)  # one token per line, or the comma-separated form


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTE_", extra="ignore", populate_by_name=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    pools: Annotated[dict[str, list[str]], NoDecode] = Field(
        default_factory=dict, description="pool name -> worker gRPC endpoints"
    )
    pool_modes: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="pool name -> the engine mode its (multi-mode) workers run it in"
    )
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("SPECROUTE_REDIS_URL", "REDIS_URL", "redis_url")
    )
    model_name: str | None = Field(default=None, description="served model id (default: the workers' model id)")
    model_aliases: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["specroute"])

    admin_tokens: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        validation_alias=AliasChoices("SPECROUTE_ADMIN_TOKEN", "SPECROUTE_ADMIN_TOKENS", "admin_tokens"),
    )
    admin_token_file: Path | None = Field(default=None, description="file holding the admin token(s)")
    insecure_admin: bool = False
    api_keys: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    api_keys_file: Path | None = Field(default=None, description="file holding the client API key(s)")
    api_key_limits: Annotated[dict[str, KeyLimits], NoDecode] = Field(
        default_factory=dict, description="per-key limits: name -> {rpm, tpm, pools, domains} (router/keys/ring.py)")
    key_hash_secret: SecretStr | None = Field(
        default=None, description="the HMAC key API key secrets are hashed under (default: one random secret "
                                  "shared by the gateways in Redis, `{specroute}:keys:hash-secret`)")
    metrics_key_names: bool = Field(
        default=False, description="label per-key metrics with the key's name (default: `redacted`)")

    request_timeout_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=10)
    affinity_slack: float = Field(
        default=1.0, ge=0,
        description="rows of load balance a worker choice may give up to batch hot (T > 0.8) requests with "
                    "hot ones and the rest with the rest (router/routing/affinity.py); 0: least-loaded only")
    # conversations (router/routing/conversation.py, router/state/conversations.py)
    conversation_affinity: bool = Field(default=True, description="keep a conversation on its pool and worker "
                                        "while switching gains less than prefilling its history elsewhere")
    conversation_header: str = Field(default="x-conversation-id", min_length=1, max_length=64,
                                     description="the request header that names a conversation")
    conversation_ttl_s: float = Field(default=1800.0, gt=0, le=30 * 86400.0,
                                      description="how long after its last turn a conversation keeps its worker")
    conversation_expected_tokens: float = Field(
        default=256.0, gt=0, description="answer tokens a turn is expected to take when it sets no max_tokens "
                                         "(the gain of switching is over these)")
    conversation_prefill_ms: float = Field(
        default=1.0, ge=0, description="prefill ms per prompt token of a pool not yet observed")
    health_interval_s: float = Field(default=1.0, gt=0)
    health_timeout_s: float = Field(default=1.0, gt=0)
    breaker_failures: int = Field(default=3, ge=1)
    breaker_cooldown_s: float = Field(default=5.0, ge=0)
    dns_refresh_s: float = Field(default=5.0, gt=0, description="re-resolve `dns:///` pool members this often")
    info_interval_s: float = Field(default=10.0, gt=0, description="re-read each worker's Info this often")
    stats_interval_s: float = Field(default=1.0, gt=0)
    redis_timeout_s: float = Field(default=0.5, gt=0)
    gateway_feedback: bool = Field(
        default=False, description="also write per-request feedback from the gateway (for workers that do not)"
    )
    # the per-request acceptance predictor (router/routing/predictor.py, router/state/predictor.py): the
    # policy's prior, refitted every `predictor_retrain_s` from the newest feedback records
    predictor: bool = Field(default=True, description="use (and retrain) the per-request acceptance predictor")
    predictor_check_s: float = Field(default=30.0, gt=0, description="how often a gateway checks the stored predictor")
    predictor_retrain_s: float = Field(default=600.0, gt=0, description="refit when the stored predictor is this old")
    predictor_records: int = Field(default=5000, ge=1, le=100_000, description="newest feedback records a fit reads")
    predictor_min_records: int = Field(default=200, ge=1, description="records with features a fit needs")
    predictor_ridge: float = Field(default=30.0, ge=0.0, description="ridge penalty of the fit")
    predictor_prior_weight: float = Field(default=30.0, ge=0.0,
                                          description="requests of evidence a per-request prediction is worth")
    # HTTP connections (router/http/guard.py): a client gets this long to send a request's headers,
    # then its body; idle keep-alive connections close after `keepalive_timeout_s`; connections over
    # `max_connections` get a 503 at once
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    keepalive_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=2048, ge=1)
    drain_timeout_s: float = Field(default=10.0, ge=0, description="on SIGTERM: how long in-flight requests may finish")
    # structured access log of the completion endpoints (router/observability/access_log.py): off by default
    access_log: bool = Field(default=False, description="write one JSON line per completion request")
    access_log_sample: float = Field(default=1.0, ge=0.0, le=1.0,
                                     description="share of successful requests logged (errors always are)")
    access_log_file: Path | None = Field(default=None, description="access log file (default: stderr)")
    # OpenTelemetry traces (router/observability/tracing.py): off by default; with no exporter (`none`) no span is
    # recorded, only the trace context is made and reaches the workers; spans go to stdout (`console`)
    # or over OTLP (`otlp`)
    tracing: bool = False
    trace_exporter: Literal["none", "console", "otlp"] = "none"
    otlp_endpoint: str | None = Field(default=None, description="OTLP gRPC endpoint (default: OTEL_* variables)")
    # the dashboard's charts (router/observability/timeseries.py): one sample per gateway per interval, in Redis
    timeseries_interval_s: float = Field(default=5.0, gt=0)
    timeseries_retention_s: float = Field(default=3600.0, gt=0)
    # how long `/v1/responses` keeps a stored response (for `previous_response_id`), s
    responses_ttl_s: float = Field(default=3600.0, gt=0)
    seed: int | None = Field(default=None, description="seed of the routing RNG (tests)")
    log_level: str = "info"

    @field_validator("pools", mode="before")
    @classmethod
    def _pools(cls, v: Any) -> dict[str, list[str]]:
        return parse_pools(v)

    @field_validator("pool_modes", mode="before")
    @classmethod
    def _pool_modes(cls, v: Any) -> dict[str, str]:
        return parse_pool_modes(v)

    @field_validator("admin_tokens", "api_keys", mode="before")
    @classmethod
    def _keys(cls, v: Any) -> dict[str, str]:
        return parse_keys(v)

    @field_validator("api_key_limits", mode="before")
    @classmethod
    def _limits(cls, v: Any) -> dict[str, KeyLimits]:
        return parse_limits(v)

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _aliases(cls, v: Any) -> list[str]:
        if isinstance(v, str):
            v = json.loads(v) if v.strip().startswith("[") else [x.strip() for x in v.split(",")]
        return [str(x) for x in v if str(x)]

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.redis_url == "":
            self.redis_url = None
        unknown = sorted(set(self.pool_modes) - set(self.pools))
        if unknown and self.pools:
            raise ValueError(f"pool modes name pools that do not exist: {', '.join(unknown)}")
        if self.admin_token_file is not None:
            self.admin_tokens = {**parse_keys(read_secret_file(self.admin_token_file, "admin token")),
                                 **self.admin_tokens}
        if self.api_keys_file is not None:
            self.api_keys = {**parse_keys(read_secret_file(self.api_keys_file, "API key")), **self.api_keys}
        return self

    @property
    def admin_enabled(self) -> bool:
        return bool(self.admin_tokens) or self.insecure_admin
