"""column_names: the column (or array) names a file holds, read without building a batch (for a mapping UI)."""

from __future__ import annotations

from .columns import MAX_BYTES
from .load import _label, _open, _read, _suffix


def column_names(source, format: str | None = None, *, max_bytes: int | None = MAX_BYTES) -> list[str]:
    """The names in a path, bytes or upload (as `load_batch` reads it), in the file's order.
    Raises BatchFormatError when the file cannot be opened as that format."""
    label = _label(source)
    data = _read(source, max_bytes)
    src = _open(_suffix(format, label), data, max_bytes)
    try:
        return list(src.names)
    finally:
        src.close()
