"""specroute: workload-aware gateway for speculative decoding (CLI and wire contract)."""

__version__ = "0.1.0"
