"""What several bench commands share: the `--concurrency` parser, and the wire pieces of the minimal
HTTP/1.1 keep-alive clients of `bench gateway` and `bench routing` (minimal so that the clients' own
CPU cost stays small on a machine the workers and the gateway share).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from specroute.errors import UserError


def parse_levels(text: str, example: str) -> list[int]:
    """`--concurrency` "1,16,64" (commas or spaces) -> [1, 16, 64]; `example` goes in the error."""
    try:
        levels = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--concurrency {text!r}: expected integers like {example}") from None
    if not levels or min(levels) < 1:
        raise UserError("--concurrency needs positive integers")
    return levels


class Head(NamedTuple):
    """What a client needs of a response's headers."""

    length: int | None  # Content-Length, when given
    chunked: bool  # Transfer-Encoding: chunked
    close: bool  # Connection: close


class KeepAliveConn:
    """One keep-alive connection that POSTs JSON bodies; subclasses read the responses."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def send(self, path: str, body: bytes) -> asyncio.StreamReader:
        """Connect if not connected, write `POST path` with `body`; the reader to read the response from."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write((f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        return self.reader


async def read_head(reader: asyncio.StreamReader) -> Head:
    """The header lines after the status line, through the blank line."""
    length, chunked, close = None, False, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        k, v = k.strip().lower(), v.strip().lower()
        if k == "content-length":
            length = int(v)
        elif k == "transfer-encoding" and "chunked" in v:
            chunked = True
        elif k == "connection" and v == "close":
            close = True
    return Head(length, chunked, close)


async def read_chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """A chunked body's chunks as they arrive, through the final zero-size chunk."""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return
        chunk = await reader.readexactly(size)
        await reader.readexactly(2)
        yield chunk
