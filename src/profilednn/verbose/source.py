"""Read a verbose log as a stream of byte chunks cut at line ends.

The parser never holds the whole log in memory: it reads ``chunk_bytes`` at a time
(16 MiB by default), cuts each block after its last newline and carries the rest over.
Plain files, gzip files (detected by their magic bytes, whatever the name), stdin
(``-``), raw bytes and lists of lines all arrive as the same :class:`Chunk` stream.
Bytes that are not UTF-8 are replaced (U+FFFD) so later stages always see valid text.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union

from ..errors import InputError

DEFAULT_CHUNK_BYTES = 16 * 2**20
# A line longer than MAX_LINE_BYTES is garbage for our purposes (verbose lines are a few
# hundred bytes): we keep its first KEEP_OF_OVERLONG bytes, skip the rest, count one line.
MAX_LINE_BYTES = 2**20
KEEP_OF_OVERLONG = 4096

LogSource = Union[str, os.PathLike, bytes, bytearray, Iterable[str], BinaryIO]
PAD = 64  # zero bytes after each chunk's text, so fixed-width reads never run past it
_HEADROOM = 2**16  # spare bytes allocated with a reusable chunk buffer (for the carried-over line)


@dataclass(frozen=True)
class Chunk:
    """Whole lines of the log as valid UTF-8 bytes, followed by :data:`PAD` zero bytes.

    ``text`` is the logical content (``data`` without the padding); ``index`` counts
    chunks from 0. Only the last chunk of a log may lack a final newline (a truncated
    last line). Line numbers are assigned by the reader, which sees chunks in order.
    """

    data: bytes
    size: int
    index: int
    replaced_bytes: bool = False

    @property
    def text(self) -> bytes:
        return self.data[: self.size]


def describe(source: LogSource) -> str:
    """A short name for error messages."""
    if isinstance(source, (str, os.PathLike)):
        return "stdin" if str(source) == "-" else str(source)
    if isinstance(source, (bytes, bytearray)):
        return "<bytes>"
    return "<stream>" if hasattr(source, "read") else "<lines>"


def _open_path(path: Path) -> BinaryIO:
    try:
        fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by the caller
    except FileNotFoundError:
        raise InputError(f"cannot read {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"cannot read {path}: it is a directory") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _maybe_gunzip(fh)


def _maybe_gunzip(fh: BinaryIO) -> BinaryIO:
    """Wrap ``fh`` in a gzip reader when it starts with the gzip magic bytes."""
    if not hasattr(fh, "peek"):
        fh = io.BufferedReader(fh)  # type: ignore[arg-type]
    head = fh.peek(2)[:2]  # type: ignore[attr-defined]
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


def open_binary(source: LogSource) -> BinaryIO:
    """A binary stream over ``source`` (path, ``-``, bytes or a binary file object)."""
    if isinstance(source, (str, os.PathLike)):
        if str(source) == "-":
            return _maybe_gunzip(sys.stdin.buffer)
        return _open_path(Path(source))
    if isinstance(source, (bytes, bytearray)):
        return _maybe_gunzip(io.BytesIO(bytes(source)))
    if hasattr(source, "read"):
        return _maybe_gunzip(source)  # type: ignore[arg-type]
    raise TypeError("not a binary source")


def _lines_to_blocks(lines: Iterable[str], block_bytes: int) -> Iterator[bytes]:
    """Encode an iterable of text lines (with or without their newlines) into blocks."""
    buf: list[bytes] = []
    size = 0
    for line in lines:
        if not isinstance(line, str):
            raise InputError(f"log lines must be str, got {type(line).__name__}")
        if line.endswith("\n"):
            line = line[:-1]
        b = line.encode("utf-8", errors="replace") + b"\n"
        buf.append(b)
        size += len(b)
        if size >= block_bytes:
            yield b"".join(buf)
            buf, size = [], 0
    if buf:
        yield b"".join(buf)


def _blocks_from_stream(stream: BinaryIO, block_bytes: int, name: str) -> Iterator[bytes]:
    while True:
        try:
            block = stream.read(block_bytes)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"cannot read {name}: {exc}") from None
        if not block:
            return
        yield block


def _make_chunk(parts: list[bytes | memoryview], index: int) -> Chunk:
    """Join ``parts`` into one padded chunk, replacing bytes that are not UTF-8."""
    data = b"".join([*parts, bytes(PAD)])
    size = len(data) - PAD
    if data.isascii():
        return Chunk(data, size, index)
    try:
        data[:size].decode("utf-8")
        return Chunk(data, size, index)
    except UnicodeDecodeError:
        fixed = data[:size].decode("utf-8", errors="replace").encode("utf-8")
        return Chunk(fixed + bytes(PAD), len(fixed), index, replaced_bytes=True)


def _chunks_from_blocks(blocks: Iterable[bytes], chunk_bytes: int) -> Iterator[Chunk]:
    index = 0
    carry = b""
    overlong = False  # inside a line longer than chunk_bytes: skipping to its newline
    for block in blocks:
        if overlong:
            cut = block.find(b"\n")
            if cut < 0:
                continue
            block = block[cut:]  # the newline ends the truncated line kept in carry
            overlong = False
        cut = block.rfind(b"\n")
        if cut < 0:
            carry += block
            if len(carry) > MAX_LINE_BYTES:
                carry, overlong = carry[:KEEP_OF_OVERLONG], True
            continue
        view = memoryview(block)
        yield _make_chunk([carry, view[: cut + 1]], index)
        index += 1
        carry = bytes(view[cut + 1 :])
        if len(carry) > MAX_LINE_BYTES:
            carry, overlong = carry[:KEEP_OF_OVERLONG], True
    if carry:
        yield _make_chunk([carry], index)


def _read_full(stream: BinaryIO, view: memoryview, name: str) -> int:
    """Fill ``view`` from ``stream`` (pipes return short reads); returns bytes read."""
    got = 0
    while got < len(view):
        try:
            n = stream.readinto(view[got:])  # type: ignore[attr-defined]
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"cannot read {name}: {exc}") from None
        if not n:
            break
        got += n
    return got


def _finish(buf: bytearray, size: int, index: int) -> Chunk:
    """Pad ``buf[:size]`` in place and make it a chunk (fixing bytes that are not UTF-8)."""
    buf[size : size + PAD] = bytes(PAD)
    del buf[size + PAD :]
    if buf.isascii():
        return Chunk(buf, size, index)  # type: ignore[arg-type]
    try:
        bytes(memoryview(buf)[:size]).decode("utf-8")
        return Chunk(buf, size, index)  # type: ignore[arg-type]
    except UnicodeDecodeError:
        fixed = bytes(memoryview(buf)[:size]).decode("utf-8", errors="replace").encode("utf-8")
        return Chunk(fixed + bytes(PAD), len(fixed), index, replaced_bytes=True)


def _skip_line(stream: BinaryIO, block_bytes: int, name: str) -> bytes:
    """Read past the end of the current line; returns what follows (from its newline)."""
    while True:
        extra = bytearray(block_bytes)
        n = _read_full(stream, memoryview(extra), name)
        if n == 0:
            return b""
        nl = extra.find(b"\n", 0, n)
        if nl >= 0:
            return bytes(extra[nl:n])


def _buffer(size: int, pool: list[bytearray] | None) -> bytearray:
    """A ``size``-byte buffer: a returned one where the pool has it (its memory is already
    mapped, and resizing within its allocation moves nothing), else a new one."""
    if not pool:
        buf = bytearray(size + _HEADROOM)
        del buf[size:]  # keeps the allocation: a later, slightly longer chunk fits in place
        return buf
    buf = pool.pop()
    if len(buf) > size:
        del buf[size:]
    elif len(buf) < size:
        buf.extend(bytes(size - len(buf)))
    return buf


def _chunks_from_stream(
    stream: BinaryIO, chunk_bytes: int, name: str, pool: list[bytearray] | None = None
) -> Iterator[Chunk]:
    """Read straight into each chunk's buffer (no intermediate copies)."""
    index = 0
    carry = b""
    while True:
        buf = _buffer(len(carry) + chunk_bytes + PAD, pool)
        buf[: len(carry)] = carry
        got = _read_full(stream, memoryview(buf)[len(carry) : len(carry) + chunk_bytes], name)
        size = len(carry) + got
        if got == 0:
            if carry:
                yield _finish(buf, size, index)
            return
        cut = buf.rfind(b"\n", 0, size)
        if cut < 0:
            carry = bytes(memoryview(buf)[:size])
            if len(carry) > MAX_LINE_BYTES:  # keep the start of this overlong line only
                carry = carry[:KEEP_OF_OVERLONG] + _skip_line(stream, max(chunk_bytes, 2**16), name)
            continue
        carry = bytes(buf[cut + 1 : size])
        yield _finish(buf, cut + 1, index)
        index += 1


def iter_chunks(
    source: LogSource, chunk_bytes: int = DEFAULT_CHUNK_BYTES, pool: list[bytearray] | None = None
) -> Iterator[Chunk]:
    """Yield the log as :class:`Chunk` s of about ``chunk_bytes`` (whole lines each).

    ``pool``: a consumer that is done with a chunk may append its ``data`` (a bytearray)
    here, and a later chunk is read into it instead of freshly allocated memory.
    """
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    if isinstance(source, (str, os.PathLike, bytes, bytearray)) or hasattr(source, "read"):
        stream = open_binary(source)  # type: ignore[arg-type]
        own = isinstance(source, (str, os.PathLike)) and str(source) != "-"
        try:
            if hasattr(stream, "readinto"):
                yield from _chunks_from_stream(stream, chunk_bytes, describe(source), pool)
            else:
                yield from _chunks_from_blocks(
                    _blocks_from_stream(stream, chunk_bytes, describe(source)), chunk_bytes
                )
        finally:
            if own:
                stream.close()
        return
    if isinstance(source, Iterable):
        yield from _chunks_from_blocks(_lines_to_blocks(source, chunk_bytes), chunk_bytes)
        return
    raise InputError(f"cannot read a log from a {type(source).__name__}")
