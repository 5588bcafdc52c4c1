"""Refs back to raw bytes: ``PATH#Lstart-Lend`` (optionally followed by a JSON pointer ``/a/0``).

PATH is relative to the bundle root; lines are 1-based and inclusive. Resolving a ref re-hashes
the whole raw file and checks it against the manifest, so what is shown is the frozen bytes.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.adapters.spans import ref_lines, resolve_element_at
from pipeline.bundle.manifest import MANIFEST_FILE, Manifest, read_frozen, read_manifest
from pipeline.bundle.request import check_relative
from pipeline.core.canonical import sha256_bytes
from pipeline.core.errors import BadInput, BundleError
from pipeline.core.refs import REF
from pipeline.core.zips import ZIP_ERRORS
from pipeline.ir.export import read_run_json, run_bundle
from pipeline.ir.redact import raw_paths, redact


@dataclass(frozen=True)
class Ref:
    """A parsed ref."""

    path: str
    line_start: int
    line_end: int
    json_pointer: str | None = None

    def __str__(self) -> str:
        return f"{self.path}#L{self.line_start}-L{self.line_end}{self.json_pointer or ''}"


@dataclass(frozen=True)
class RefView:
    """What a ref points at: the raw lines, and the element when the ref has a JSON pointer."""

    ref: Ref
    lines: str
    element: str | None = None
    sha256: str = ""
    position: str | None = None  # where the element sits: "line 3, characters 120-980 of member M"

    def to_json(self, lines: bool = True) -> dict[str, Any]:
        """Machine-readable form (``lines`` False: a pointer ref's element only, not its whole line)."""
        out: dict[str, Any] = {"ref": str(self.ref), "element": self.element, "position": self.position}
        if lines or self.element is None:
            out["lines"] = self.lines
        return {**out, "sha256": self.sha256}


def parse_ref(text: str) -> Ref:
    """Parse ``PATH#Lstart-Lend[/json/pointer]``; a malformed or escaping ref is BadInput."""
    m = REF.match(text.strip())
    if m is None:
        raise BadInput(f"not a ref: {text!r} (expected PATH#Lstart-Lend, e.g. cells/C001/controller.jsonl#L3-L3)")
    start = int(m["start"])
    end = int(m["end"]) if m["end"] else start
    if start < 1 or end < start:
        raise BadInput(f"bad line range in ref {text!r}: lines are 1-based and start <= end")
    check_relative(m["path"], "ref path")
    return Ref(m["path"], start, end, m["pointer"])


def ref_of(source_path: str, line_start: int, line_end: int, json_pointer: str | None = None) -> str:
    """The ref string of an event's source columns."""
    return str(Ref(source_path, line_start, line_end, json_pointer))


def _pointer_element(raw: bytes, ref: Ref) -> tuple[str, str | None]:
    pointer = ref.json_pointer or ""
    try:
        # the span locator also checks that the element lies within the ref's lines
        element, place = resolve_element_at(raw, ref.line_start, ref.line_end, pointer)
    except (ValueError, KeyError, IndexError, json.JSONDecodeError) as exc:
        raise BundleError(f"ref {ref} does not resolve: {exc}") from None
    try:
        return json.dumps(json.loads(element), ensure_ascii=False, indent=2, sort_keys=True), place
    except json.JSONDecodeError:
        return element, place  # a string element (or its selected lines) is shown as text


def _plain_pointer(raw: bytes, ref: Ref) -> str:
    text = raw.decode("utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = json.loads(text.split("\n")[ref.line_start - 1])
    node: Any = doc
    for tok in (ref.json_pointer or "")[1:].split("/"):
        tok = tok.replace("~1", "/").replace("~0", "~")
        node = node[int(tok)] if isinstance(node, list) else node[tok]
    return json.dumps(node, ensure_ascii=False, indent=2, sort_keys=True)


def _frozen_bundle(run_dir: Path) -> tuple[Path, Any]:
    """The run's bundle and manifest, refusing a bundle re-frozen since the export."""
    bundle = run_bundle(run_dir)
    manifest = read_manifest(bundle)
    expected = read_run_json(run_dir).get("bundle_digest")
    if expected and sha256_bytes((bundle / MANIFEST_FILE).read_bytes()) != expected:
        raise BundleError(f"bundle {bundle} was re-frozen since this run was exported (manifest digest differs)")
    return bundle, manifest


_RAW: list[tuple[Manifest, dict[str, str]]] = []  # the last manifest's display -> raw paths


def raw_path(manifest: Manifest, path: str) -> str:
    """The bundle path a ref's path names: itself, or the raw name of a path shown redacted.

    The IR, refs and the report store a path whose names hold a secret redacted
    (``REDACTED-<kind>``, :func:`pipeline.ir.redact.display_paths`); the frozen manifest maps it back,
    so the ref still resolves to and hash-checks the raw bytes.
    """
    if path in manifest.by_path:
        return path
    if not _RAW or _RAW[0][0] is not manifest:
        _RAW[:] = [(manifest, raw_paths([f.path for f in manifest.files]))]
    return _RAW[0][1].get(path, path)


def _ref_text(raw: bytes, ref: Ref) -> str:
    """The raw lines a ref names (of the file, or of the zip member its pointer names); one-line errors."""
    try:
        return ref_lines(raw, ref.line_start, ref.line_end, ref.json_pointer)
    except UnicodeDecodeError:
        raise BundleError(f"invalid UTF-8 in {ref.path} lines {ref.line_start}-{ref.line_end}") from None
    except (ValueError, KeyError, *ZIP_ERRORS) as exc:
        raise BadInput(f"ref {ref} does not resolve: {exc}") from None


def resolve_ref(run_dir: Path, ref: str | Ref) -> RefView:
    """The frozen bytes behind a ref of this run (hash-checked); errors are one line."""
    parsed = parse_ref(ref) if isinstance(ref, str) else ref
    bundle, manifest = _frozen_bundle(run_dir)
    rel = raw_path(manifest, parsed.path)
    raw = read_frozen(bundle, rel, manifest)
    text = _ref_text(raw, parsed)
    element, place = _pointer_element(raw, parsed) if parsed.json_pointer else (None, None)
    return RefView(parsed, text, element, manifest.get(rel).sha256, place)


def redacted(view: RefView) -> RefView:
    """The view with secrets replaced as in the IR (:mod:`pipeline.ir.redact`); refs and hashes unchanged."""
    element = redact(view.element)[0] if view.element is not None else None
    return replace(view, lines=redact(view.lines)[0], element=element)


def show_ref(run_dir: Path, ref: str, line: bool = False, unredacted: bool = False) -> str:
    """What ``ref`` names in the frozen bytes (hash-checked).

    A ref without a JSON pointer: exactly its raw lines. With one: a ``# PATH POSITION POINTER``
    line and the element alone; one line of JSON Lines may hold a whole run (a 300 kB MAST turn,
    an Inspect sample with its target and scores), so ``line`` asks for the raw lines instead.
    Secrets are shown as ``[REDACTED:<kind>]`` (what is printed may be pasted anywhere); with
    ``unredacted`` the exact bytes of the user's own bundle. The hash is checked either way.
    """
    view = resolve_ref(run_dir, ref)
    if not unredacted:
        view = redacted(view)
    if view.element is None or line:
        return view.lines
    return f"# {view.ref.path} {view.position} {view.ref.json_pointer}\n{view.element}"


def show_ref_context(run_dir: Path, ref: str, context: int, pretty: bool = False, unredacted: bool = False) -> str:
    """The raw lines behind ``ref`` numbered, cited ones marked ``>``, with ``context`` lines either side.

    ``pretty`` adds each cited line pretty-printed when it is JSON (the raw line stays as logged).
    Secrets are redacted as in :func:`show_ref` unless ``unredacted``.
    """
    parsed = parse_ref(ref)
    reader = RefReader(run_dir)
    view = reader.view(parsed)
    if parsed.json_pointer:  # lines of one document or member: no file context to add
        return show_ref(run_dir, ref, unredacted=unredacted)
    lines = reader.file_lines(parsed.path)
    if not unredacted:
        lines = [redact(line)[0] for line in lines]
    lo, hi = max(1, parsed.line_start - context), min(len(lines), parsed.line_end + context)
    out = [f"# {view.ref} sha256 {view.sha256}"]
    for n in range(lo, hi + 1):
        cited = parsed.line_start <= n <= parsed.line_end
        out.append(f"{'>' if cited else ' '}{n:>6}  {lines[n - 1]}")
        if cited and pretty:
            with contextlib.suppress(json.JSONDecodeError):  # a line that is not JSON is shown raw only
                out.append(json.dumps(json.loads(lines[n - 1]), ensure_ascii=False, indent=2, sort_keys=True))
    return "\n".join(out)


def read_refs(run_dir: Path, refs: list[str]) -> dict[str, str]:
    """Many refs at once (each raw file hash-checked once): ref -> its raw lines. Any bad ref raises."""
    bundle, manifest = _frozen_bundle(run_dir)
    files: dict[str, bytes] = {}
    out: dict[str, str] = {}
    for text in refs:
        ref = parse_ref(text)
        if ref.path not in files:
            files[ref.path] = read_frozen(bundle, raw_path(manifest, ref.path), manifest)
        out[text] = _ref_text(files[ref.path], ref)
    return out


class RefReader:
    """Resolve many refs of one run: the manifest is read once, each raw file read and hashed once.

    Unlike :func:`read_refs` a bad ref or a changed file is not fatal: :meth:`view` raises a
    one-line LunasolError for that ref only, and the file's error is remembered. Only the file last
    asked for is kept in memory, so callers that go file by file (sorted refs) stay at one file's
    bytes however large the bundle.
    """

    def __init__(self, run_dir: Path) -> None:
        self.bundle, self.manifest = _frozen_bundle(run_dir)
        self._path: str | None = None
        self._raw: bytes | BundleError = b""
        self._lines: list[str] | None = None

    def _file(self, rel: str) -> bytes:
        if rel != self._path:
            self._path, self._lines = rel, None
            try:
                self._raw = read_frozen(self.bundle, raw_path(self.manifest, rel), self.manifest)
            except BundleError as exc:
                self._raw = exc
        if isinstance(self._raw, BundleError):
            raise self._raw
        return self._raw

    def file_lines(self, rel: str) -> list[str]:
        """Every line of a frozen file (decoded once per file), for context around a ref."""
        raw = self._file(rel)
        if self._lines is None:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BundleError(f"invalid UTF-8 in {rel}") from None
            lines = text.split("\n")
            self._lines = lines[:-1] if text.endswith("\n") else lines
        return self._lines

    def view(self, ref: str | Ref) -> RefView:
        """What one ref points at (hash checked), as :func:`resolve_ref` returns it."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        raw = self._file(parsed.path)
        if parsed.json_pointer:
            text = _ref_text(raw, parsed)
            element, place = _pointer_element(raw, parsed)
        else:
            lines = self.file_lines(parsed.path)
            if parsed.line_end > len(lines):
                raise BadInput(
                    f"ref {parsed} does not resolve: lines {parsed.line_start}-{parsed.line_end} are past the end "
                    f"of the file ({len(lines)} lines)"
                )
            text, element, place = "\n".join(lines[parsed.line_start - 1 : parsed.line_end]), None, None
        return RefView(parsed, text, element, self.manifest.get(raw_path(self.manifest, parsed.path)).sha256, place)
