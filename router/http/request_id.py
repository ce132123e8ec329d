"""The request id of a completion: the client's `x-request-id` when it sends a usable one, else a
fresh random one. It is echoed in the response's `x-request-id`, names the completion (`chatcmpl-ID`),
goes to the worker (`GenerateRequest.request_id`: its logs and the feedback record) and into the
gateway's access log.

A client's id is bounded (`MAX_CHARS`) and sanitised (characters outside `[A-Za-z0-9._:/+=@-]` are
dropped), so it cannot forge log lines or headers; nothing usable left means a fresh id.
"""

from __future__ import annotations

import os
import re

MAX_CHARS = 128
_BAD = re.compile(rb"[^A-Za-z0-9._:/+=@-]+")


def new_request_id() -> str:
    return os.urandom(12).hex()


def request_id(header: bytes | None) -> str:
    """The id for a request whose `x-request-id` header is `header` (raw bytes, None if absent)."""
    if header:
        rid = _BAD.sub(b"", header[: MAX_CHARS * 4])[:MAX_CHARS]
        if rid:
            return rid.decode("ascii")
    return new_request_id()
