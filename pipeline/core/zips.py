"""Zip containers of foreign logs (Inspect ``.eval``), with zstd members readable.

inspect_ai (0.3.x) writes every ``.eval`` member with zstd, zip method 93. Stdlib ``zipfile``
reads that method only from Python 3.14; before, importing ``zipfile_zstd`` (the package
inspect_ai depends on for the same reason) registers it with stdlib ``zipfile``, so callers keep
using ``zipfile.ZipFile`` and its streamed, bounded member reads. Every zip reader of lunasol
opens through :func:`open_zip` so the registration has happened before the first read.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

from pipeline.core.limits import check_count

if sys.version_info < (3, 14):
    import zipfile_zstd  # noqa: F401  (registers zip method 93 with stdlib zipfile on import)

ZIP_ERRORS = (zipfile.BadZipFile, NotImplementedError)
"""What a damaged zip or one with a compression method nobody registered raises on open or read."""


def open_zip(source: Path | bytes, where: str | None = None) -> zipfile.ZipFile:
    """A read-only ZipFile over a path or in-memory bytes (zstd, deflate, bzip2, lzma, stored).

    An archive of more members than ``LUNASOL_MAX_ZIP_MEMBERS`` is refused (one BundleError line,
    naming ``where`` or the path): each member costs memory long before any is read.
    """
    zf = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source)
    try:
        label = where or ("the zip" if isinstance(source, bytes) else str(source))
        check_count(len(zf.filelist), "LUNASOL_MAX_ZIP_MEMBERS", label, "members")
    except BaseException:
        zf.close()
        raise
    return zf
