"""Secrets stay out of `ps`: admin tokens and API keys from files (`--admin-token-file`,
`--api-key-file`, `SPECROUTE_ADMIN_TOKEN_FILE`, `SPECROUTE_API_KEYS_FILE`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import build_parser, settings_from_args
from router.settings import Settings, token_name


def test_tokens_from_files_and_flags_warn(tmp_path: Path) -> None:
    (tmp_path / "admin").write_text("ops:s3cret-admin-token\nsecond-token-0123456789\n")
    (tmp_path / "keys").write_text("key-1-0123456789abcdef, key-2-0123456789abcdef\n")
    s = Settings(admin_token_file=tmp_path / "admin", api_keys_file=tmp_path / "keys")
    assert s.admin_tokens == {"ops": "s3cret-admin-token", token_name("second-token-0123456789"): "second-token-0123456789"}
    assert set(s.api_keys.values()) == {"key-1-0123456789abcdef", "key-2-0123456789abcdef"}
    args = build_parser().parse_args(["--pool", "mtp=127.0.0.1:1", "--admin-token-file", str(tmp_path / "admin"),
                                      "--api-key-file", str(tmp_path / "keys")])
    s = settings_from_args(args)
    assert s.admin_tokens["ops"] == "s3cret-admin-token" and set(s.api_keys.values()) == {"key-1-0123456789abcdef", "key-2-0123456789abcdef"}
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        Settings(admin_token_file=tmp_path / "empty")


def test_token_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "admin").write_text("from-file-0123456789\n")
    monkeypatch.setenv("SPECROUTE_ADMIN_TOKEN_FILE", str(tmp_path / "admin"))
    assert Settings().admin_tokens == {token_name("from-file-0123456789"): "from-file-0123456789"}
    monkeypatch.setenv("SPECROUTE_ADMIN_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot read"):
        Settings()
