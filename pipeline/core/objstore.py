"""Object storage URLs (``s3://``, ``gs://``, ``az://``, ``file://``) through fsspec and its backends.

lunasol reads logs from, and writes tables and reports to, a bucket with the backend's own
credential chain (env vars such as ``AWS_ACCESS_KEY_ID`` / ``AWS_ENDPOINT_URL``, profiles, instance
roles): nothing here takes, keeps or prints a credential. Every error is one :class:`BadInput` line
naming the URL as :func:`shown` keeps it (userinfo and secret query values marked) and never the
backend's message, which may quote a key id or a signed request.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.errors import BadInput
from pipeline.core.urls import shown_url

# scheme -> (the fsspec backend that reads it, the lunasol extra that installs it)
BACKENDS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "file": ("fsspec", "s3"),
}
_HINT = {
    "s3fs": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL",
    "gcsfs": "GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login",
    "adlfs": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with a key or az login",
}


def scheme(text: str) -> str:
    """The URL scheme of ``text`` (lower case), or "" when it is a plain path."""
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isascii() and head.replace("+", "").isalnum() else ""


def is_url(text: str | os.PathLike[str]) -> bool:
    """True when ``text`` names object storage (a scheme lunasol reads), not a local path."""
    return scheme(str(text)) in BACKENDS


def shown(url: str) -> str:
    """``url`` as errors, logs and records show it: credentials in it replaced by a marker."""
    return shown_url(url)


def local_path(url: str) -> Path | None:
    """The local path of a ``file://`` URL (read and written as any local path), else None."""
    return Path(url.split("://", 1)[1]) if scheme(url) == "file" else None


def open_url(url: str) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url``; a backend that is not installed is one line naming it."""
    kind = scheme(url)
    if kind not in BACKENDS:
        raise BadInput(f"unsupported URL scheme in {shown(url)}; lunasol reads s3://, gs://, az:// and file://")
    module, extra = BACKENDS[kind]
    try:
        import fsspec  # startup: only a URL argument loads fsspec and its backend

        # a fresh client each time: fsspec's instance cache would keep the credentials of an earlier call
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except ImportError:
        raise BadInput(f"reading {kind}:// needs {module}: pip install 'lunasol[{extra}]'") from None
    except (ValueError, TypeError):
        raise BadInput(f"cannot read the URL {shown(url)}") from None
    return fs, str(path)


def why(exc: BaseException) -> str:
    """What went wrong with a storage call, in words that never quote the backend's message."""
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return "not found (no such bucket, container or key)"
    if isinstance(exc, PermissionError) or name in {"ClientAuthenticationError", "Forbidden", "Unauthorized"}:
        return "access denied: check the credentials"
    if name in {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "CredentialRetrievalError"}:
        return "no credentials found"
    if name in {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"} or isinstance(
        exc, ConnectionError | TimeoutError
    ):
        return "the storage endpoint did not answer"
    return f"storage error ({name})"


@contextmanager
def storage_errors(url: str, doing: str) -> Iterator[None]:
    """Turn any backend failure inside into one BadInput line: ``cannot DOING URL: why``."""
    try:
        yield
    except BadInput:
        raise
    except Exception as exc:  # backends raise OSError, botocore and azure errors alike
        module = BACKENDS.get(scheme(url), ("", ""))[0]
        reason = why(exc)
        hint = f" ({_HINT[module]})" if reason.startswith(("access", "no credentials")) and module in _HINT else ""
        raise BadInput(f"cannot {doing} {shown(url)}: {reason}{hint}") from None


def join(url: str, name: str) -> str:
    """``url`` with one more path part (a key under a prefix)."""
    return url.rstrip("/") + "/" + name


def put_file(local: Path, url: str) -> None:
    """Write the local file ``local`` to ``url`` whole: no reader ever sees part of it at the final key.

    An object store's single PUT (or multipart upload) makes the object visible only when complete;
    a ``file://`` target is written to a temporary sibling and renamed.
    """
    target = local_path(url)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            with local.open("rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    fs, path = open_url(url)
    with storage_errors(url, "write"):
        fs.put_file(str(local), path)


def put_files(base: str, files: Sequence[tuple[Path, str]]) -> None:
    """Write each local file to ``base``/its key, each whole (as :func:`put_file`), through one client.

    A client per file costs its backend's session setup each time (s3fs: ~0.25 CPU s, so a 400-file
    report took 100 s); one client uploads them concurrently. Nothing is ordered among ``files``:
    write what a reader opens first in a later call.
    """
    if not files:
        return
    if local_path(base) is not None:
        for local, key in files:
            put_file(local, join(base, key))
        return
    fs, path = open_url(base)
    with storage_errors(base, "write"):
        fs.put([str(local) for local, _ in files], [join(path, key) for _, key in files])


def _tag(info: dict[str, Any]) -> tuple[str | None, str | None]:
    """(etag, version id) of one listed object, whichever names the backend uses."""
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    if etag is None and info.get("mtime") is not None:  # a local file (file://): its mtime stands in
        etag = f"mtime:{info['mtime']}"
    version = info.get("VersionId") or info.get("version_id") or info.get("generation")
    return (str(etag).strip('"') if etag is not None else None), (str(version) if version is not None else None)


def list_objects(
    url: str, opened: tuple[Any, str] | None = None
) -> tuple[bool, dict[str, tuple[str | None, str | None, int]]]:
    """Every object under ``url``: ``(single, {key: (etag, version id, size)})``, keys relative to ``url``.

    ``single`` is True when ``url`` names one object (its key is then its own name). A prefix
    with nothing under it, a missing bucket and a denied listing are one BadInput line each.
    """
    fs, path = opened or open_url(url)  # ``opened``: the client of an earlier open_url(url), reused
    with storage_errors(url, "list"):
        root = path.rstrip("/")
        found = fs.find(root, withdirs=False, detail=True)
        if not found and fs.isfile(root):
            found = {root: fs.info(root)}
    if not found:
        raise BadInput(f"source not found: {shown(url)} (no object under it)")
    single = len(found) == 1 and next(iter(found)).rstrip("/") == root
    out: dict[str, tuple[str | None, str | None, int]] = {}
    for name, info in found.items():
        if info.get("type") == "directory" or name.endswith("/"):
            continue  # a folder marker object holds no log
        key = root.rsplit("/", 1)[-1] if single else name[len(root) :].lstrip("/")
        etag, version = _tag(info)
        out[key] = (etag, version, int(info.get("size") or 0))
    return single, out
