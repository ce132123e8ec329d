"""`specroute gateway`: run the OpenAI-compatible gateway (uvicorn, one process).

Flags override `SPECROUTE_*` environment variables; see router/settings.py for every setting.
Secrets belong in the environment or in files (`--admin-token-file`, `--api-key-file`): a token
given as a flag is visible to every user of the machine in `ps`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from pydantic import ValidationError

from specroute.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute gateway", description=__doc__)
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    p.add_argument("--pool", action="append", metavar="NAME=HOST:PORT[,HOST:PORT]",
                   help="a worker pool and its gRPC endpoints (repeat for several pools); a member "
                        "dns:///HOST:PORT means every address HOST resolves to, re-resolved every "
                        "$SPECROUTE_DNS_REFRESH_S seconds (Kubernetes: a headless Service)")
    p.add_argument("--pool-mode", action="append", metavar="NAME=MODE",
                   help="the engine mode a pool's workers run its requests in, for workers serving several "
                        "modes over one target (`specroute worker --engine mtp,dfly,ar`); repeatable")
    p.add_argument("--affinity-slack", type=float, metavar="ROWS",
                   help="rows of load balance a worker choice may give up to batch hot (T > 0.8) requests with hot "
                        "ones and the rest with the rest (router/routing/affinity.py; default 1; 0: least loaded only)")
    p.add_argument("--redis-url", help="Redis for policy and statistics (default: $REDIS_URL; none = local only)")
    p.add_argument("--admin-token", help="admin bearer token(s) `token` or `name:token,...` (visible in `ps`: "
                                         "prefer $SPECROUTE_ADMIN_TOKEN or --admin-token-file)")
    p.add_argument("--admin-token-file", help="file with the admin token(s), one per line or `name:token`")
    p.add_argument("--insecure-admin", action="store_true", default=None,
                   help="serve the admin API without a token (local development only)")
    p.add_argument("--api-key", action="append", help="accepted client API key (repeat; visible in `ps`: prefer "
                                                      "$SPECROUTE_API_KEYS or --api-key-file); default: no auth")
    p.add_argument("--api-key-file", help="file with the accepted client API keys, one per line")
    p.add_argument("--model-name", help="served model id (default: the workers' model id)")
    p.add_argument("--request-timeout", type=float, dest="request_timeout_s", help="per-request deadline, s")
    p.add_argument("--gateway-feedback", action="store_true", default=None,
                   help="write acceptance feedback from the gateway (for workers that do not)")
    p.add_argument("--drain-timeout", type=float, dest="drain_timeout_s",
                   help="on SIGTERM, seconds in-flight requests may take to finish (default 10)")
    p.add_argument("--access-log", action="store_true", default=None,
                   help="write one JSON line per completion request ($SPECROUTE_ACCESS_LOG)")
    p.add_argument("--access-log-sample", type=float, metavar="SHARE",
                   help="share of successful requests in the access log, 0..1 (default 1; errors always)")
    p.add_argument("--access-log-file", help="access log file (default: stderr)")
    p.add_argument("--tracing", action="store_true", default=None,
                   help="OpenTelemetry traces per request, context passed to the workers ($SPECROUTE_TRACING)")
    p.add_argument("--trace-exporter", choices=["none", "console", "otlp"],
                   help="where spans go (default none: nothing recorded, only the context passed on; "
                        "otlp needs opentelemetry-exporter-otlp)")
    p.add_argument("--otlp-endpoint", help="OTLP gRPC endpoint for --trace-exporter otlp")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return p


def settings_from_args(args: argparse.Namespace) -> Any:
    from router.settings import Settings

    overrides: dict[str, Any] = {}
    for key in ("host", "port", "redis_url", "insecure_admin", "model_name", "request_timeout_s",
                "gateway_feedback", "log_level", "admin_token_file", "api_key_file", "drain_timeout_s",
                "access_log", "access_log_sample", "access_log_file", "tracing", "trace_exporter", "otlp_endpoint",
                "affinity_slack"):
        val = getattr(args, key)
        if val is not None:
            overrides[key] = val
    if "api_key_file" in overrides:
        overrides["api_keys_file"] = overrides.pop("api_key_file")
    if args.pool:
        overrides["pools"] = ";".join(args.pool)
    if args.pool_mode:
        overrides["pool_modes"] = ";".join(args.pool_mode)
    if args.admin_token:
        overrides["admin_tokens"] = args.admin_token
    if args.api_key:
        overrides["api_keys"] = ",".join(args.api_key)
    try:
        settings = Settings(**overrides)
    except (ValidationError, ValueError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        msg = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}" if first else str(exc)
        raise UserError(f"invalid gateway settings: {msg}") from None
    if not settings.pools:
        raise UserError("no worker pools: pass --pool NAME=HOST:PORT (or set SPECROUTE_POOLS)")
    return settings


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    import uvicorn

    from router.app import create_app
    from router.http.guard import uvicorn_options

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for flag in ("admin_token", "api_key"):
        if getattr(args, flag):
            logging.getLogger("specroute.gateway").warning(
                "--%s puts a secret on the command line, where `ps` shows it to every user: use "
                "--%s-file or the environment instead", flag.replace("_", "-"), flag.replace("_", "-"))
    if not settings.admin_enabled:
        logging.getLogger("specroute.gateway").warning(
            "admin API disabled: set SPECROUTE_ADMIN_TOKEN (or --insecure-admin for local development)")
    app = create_app(settings, tune_gc=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
                loop="uvloop", **uvicorn_options(settings))
    return 0
