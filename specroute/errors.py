"""Errors that the CLI turns into a one-line message and exit code 2 (no traceback)."""


class UserError(Exception):
    """Bad input from the user: unknown model directory, unsupported config, prompt too long, ..."""
