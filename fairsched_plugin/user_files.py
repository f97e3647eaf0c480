"""Files a user names (a trace, a case, a pool, a profile, a config): read as text, and
output paths made ready, every problem one line that names the file.

Opened as text and parsed line by line, a binary or compressed file fails in the middle
of the parse with ``UnicodeDecodeError``, whose message names a byte position but not the
file, and a directory fails with ``IsADirectoryError``; an output path under a folder that
does not exist fails with ``FileNotFoundError`` only once the work is done. Here each is
an error the tools already report as ``error: ...``, raised before the parse or the work.
"""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

GZIP_MAGIC = b"\x1f\x8b"


class UserFileError(ValueError):
    """A file that cannot be read, or an output path that cannot be written; the message
    names the path."""


def json_object(text: str, error: Callable[[str], Exception], where: str = "") -> dict[str, Any]:
    """``text`` parsed as JSON, which must be an object; otherwise ``error`` with a message
    that starts with ``where`` (the file and line, the variable, the model's metadata),
    when the reader knows it."""
    prefix = f"{where}: " if where else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{prefix}not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{prefix}must hold a JSON object, got {type(value).__name__}")
    return value


def read_text(path: str | Path,
              error: Callable[[str], Exception] = UserFileError,
              gzipped: bool = False) -> str:
    """The whole of ``path`` as text (UTF-8, a leading byte-order mark dropped, as a
    spreadsheet's CSV export writes one); with ``gzipped``, a gzip-compressed file is
    decompressed first. A missing file, a directory, an unreadable file or one that is not
    text raises ``error(message)``, the message ``PATH: ...``: the reader's own error type,
    so what its callers catch covers it."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, not a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: unreadable: {exc.strerror or exc}") from None
    if data.startswith(GZIP_MAGIC) and gzipped:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise error(f"{path}: a damaged gzip file ({exc})") from None
    if data.startswith(GZIP_MAGIC):
        raise error(f"{path}: not a text file (gzip-compressed: decompress it first)")
    # NUL is valid UTF-8 but no text file holds one (a UTF-16 file is full of them).
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{path}: not a text file (a NUL byte on line {_line(data, nul)})")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a text file (not UTF-8 on line "
                    f"{_line(data, exc.start)}: {exc.reason})") from None


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def output_file(path: Path) -> Path:
    """``path`` ready to be written as a file: its folder made when missing. A directory
    at ``path``, or a folder that cannot be made, is :class:`UserFileError`."""
    if path.is_dir():
        raise UserFileError(f"{path}: is a directory; give the output file's name")
    _make_folder(path.parent, path)
    return path


def output_dir(path: Path) -> Path:
    """``path`` made, with its parents, to hold a run's outputs. A file there, or a folder
    that cannot be made, is :class:`UserFileError`."""
    if path.exists() and not path.is_dir():
        raise UserFileError(f"{path}: is a file; give a directory for the outputs")
    _make_folder(path, path)
    return path


def _make_folder(folder: Path, path: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFileError(f"{path}: cannot create the folder {folder}: "
                            f"{exc.strerror or exc}") from None
