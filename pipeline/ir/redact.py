"""Secrets in logs never reach the IR: found once, where event text enters it, and replaced by a typed marker.

Agent logs carry what the agent saw: an ``.env`` it printed, a curl with an ``Authorization``
header, a key pasted into a prompt. Everything lunasol shows a model (prompts, hence recordings
and replay keys), a reviewer (report.html) or a query (ir.duckdb) is made from the IR's event
text, so redacting there, before the text is trimmed, covers them all. Both export paths make
one call, :func:`redact_column`, on each cell's ``text`` and ``target`` columns
(``pipeline.ir.rows.ColumnBuilder``, the one builder both export paths use); the report,
``show-ref`` and Luna's task summaries use :func:`redact` on what they print. The frozen bundle is
never touched: refs still point at, and hash-check against, the raw bytes.

A secret becomes ``[REDACTED:<kind>]``; the kinds are the keys of :data:`KINDS`. What is kept
around it (``Bearer``, ``api_key=``) stays, so the text still reads as what happened. Besides the
rules: a base64 blob is decoded (its first 64 KiB, two levels deep) and replaced whole when its text
holds a secret (a Kubernetes secret dump); a secret wrapped across lines of one text is found with
the wrapping breaks taken out and replaced on every line it spans.

File and directory names: a bundle path whose names hold a secret is stored redacted wherever a
path is stored (the IR's ``source_path``, hence refs, prompts, the report), as ``REDACTED-<kind>``
(:func:`display_paths`; no brackets, so a ref holding it is still found in text). A ref keeps
resolving to the raw bytes: the frozen manifest maps the shown path back to the raw one
(:func:`raw_paths`, used by ``pipeline.ir.refs``), then the bytes are read and hash-checked as
always. ``verified-files.json`` names files by manifest position, not path.

Why these patterns and not Yelp's detect-secrets: on the demo's 6,404 events (1.2 MB of text)
its ``scan_line`` took 34 s and its 46 plugin regexes 1.5 s (2.7 s as one alternation), against
0.64 s for the whole export. The rules below (literal-first patterns behind a per-column needle
check) cost 1.04x on a 213,000-event export (bench/README.md). They cover the token formats of
its plugins that occur in agent logs, plus high-entropy values after key-like names.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

NO_REDACT_NOTE = "SECRET REDACTION OFF (--no-redact): the IR's text holds every secret of the logs as written"
"""What the export summary, ``lunasol status`` and the report say of a run exported with ``--no-redact``."""

KINDS: dict[str, str] = {
    "private-key": "a PEM private key block (-----BEGIN ... PRIVATE KEY-----)",
    "openai-key": "an OpenAI API key (sk-..., sk-proj-...)",
    "anthropic-key": "an Anthropic API key (sk-ant-...)",
    "aws-access-key-id": "an AWS access key id (AKIA..., ASIA...)",
    "aws-secret-key": "an AWS secret access key after its name",
    "github-token": "a GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
    "gitlab-token": "a GitLab token (glpat-...)",
    "slack-token": "a Slack token (xoxb-, xoxp-, ...)",
    "stripe-key": "a Stripe secret or restricted key (sk_live_, rk_live_)",
    "google-api-key": "a Google API key (AIza...)",
    "jwt": "a JSON Web Token (three base64url parts)",
    "bearer-token": "the credential of an Authorization header (Bearer / Basic / token)",
    "url-password": "the password in a URL (scheme://user:password@host)",
    "secret-value": "a high-entropy value after a key-like name (api_key=, password:, token=, ...)",
    "connection-string-key": "the key of a connection string or SAS URL (AccountKey=, SharedAccessKey=, sig=, ...)",
    "named-secret": "any value after a name that is a secret's (password=hunter2, token: abc-1), whatever its entropy",
    "base64-secret": "a base64 blob whose decoded bytes hold a secret (a Kubernetes secret dump), replaced whole",
}

PATH_MARKER = "REDACTED-"
"""How a secret in a file or directory name is shown: ``REDACTED-<kind>`` (no brackets, colons or spaces,
so a ref holding it is still found in text by ``pipeline.core.refs.REF_IN_TEXT``)."""

_AWS_NAME = r"(?:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)"
_SECRET_NAME = (
    r"(?:api[_-]?key|apikey|secret|token|passw(?:or)?d|pwd|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?)"
)
_VALUE = r"[^\s\\\"'`,;&<>{}\[\]()]"  # what a value after a name may hold (stops at quotes, separators, brackets)
# between a secret's name and its value: quotes (JSON, escaped JSON, Python), one of = : => and blanks
_NAMED_SEP = r"[\\\"']{0,2}[ \t]*(?:=>|[:=](?![:=]))[ \t]*[\\\"']{0,2}"
_ENTROPY_MIN = 3.5  # bits per character: random base64/hex keys are 4-6, English words and paths are lower


def _entropy(value: str) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def _looks_random(value: str) -> bool:
    # A value after a key-like name: a secret has digits and letters and high entropy; prose,
    # paths, placeholders ("${API_KEY}", "your-api-key-here") and repeated letters do not.
    if value.startswith(("$", "%", "<")) or "/" in value.strip("/"):
        return False
    return any(ch.isdigit() for ch in value) and any(ch.isalpha() for ch in value) and _entropy(value) >= _ENTROPY_MIN


_PLACEHOLDERS = frozenset(
    ("null", "none", "nil", "true", "false", "undefined", "required", "optional", "string", "str", "hidden",
     "masked", "redacted", "secret", "password", "token", "changeit", "xxx", "env", "file", "***")
)  # fmt: skip


def _named_value(value: str) -> bool:
    # After a name that IS a secret's (password=, "token": ...): any value is one, however guessable
    # (hunter2), except what only names or hides one: placeholders, masks, variables, file paths.
    low = value.lower().rstrip(".")
    if low in _PLACEHOLDERS or low.startswith(("$", "%", "*", "your", "[redacted", "redacted-", "/", "./", "~/")):
        return False
    return len(set(low)) > 1  # "xxxx", "...."


def _named_word(value: str) -> bool:
    # token=, secret: and api_key= also name counts (token: 4096) and start prose ("API Token: Follow
    # the steps", "let token = try"): letters needed, and a digit, a symbol or 10+ characters.
    if not _named_value(value) or value.replace(".", "").isdigit():
        return False
    return not value.isalpha() or len(value) >= 10


def _credential(value: str) -> bool:
    # After "Bearer" / "Basic" / "token": a real credential is random; "token usage_statistics" is prose.
    return _entropy(value) >= 3.0 and (any(ch.isdigit() for ch in value) or len(value) >= 24)


@dataclass(frozen=True)
class _Rule:
    """One kind of secret: group ``v`` of ``pattern`` is the secret, the rest of the match is kept."""

    kind: str
    needles: tuple[str, ...]  # lower-case substrings: without one of them the rule cannot match
    pattern: re.Pattern[str]
    lower: bool = False  # searched in the lower-cased text (case-insensitive without losing the fast literal scan)
    word_start: bool = True  # the match may not continue a word on its left (the cheap form of a leading \b)
    check: Callable[[str], bool] | None = None


def _rule(kind: str, needles: tuple[str, ...], pattern: str, **kw: Any) -> _Rule:
    return _Rule(kind, needles, re.compile(pattern), **kw)


# Every pattern starts with a literal (sre then scans for it at C speed; a leading \b or (?i)
# made the scan 25x slower), every run is bounded, so the cost is linear and small. Specific
# token formats come first; a later rule never replaces inside a span already replaced.
_RULES: tuple[_Rule, ...] = (
    _rule(
        "private-key",
        ("-----begin",),
        r"(?P<v>-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----(?:(?!-----END)[\s\S]){0,16384}"
        r"(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----)?)",
        word_start=False,
    ),
    _rule("anthropic-key", ("sk-ant-",), r"(?P<v>sk-ant-[A-Za-z0-9_-]{20,})"),
    _rule("openai-key", ("sk-",), r"(?P<v>sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,})"),
    _rule(
        "aws-access-key-id",
        ("akia", "asia", "abia", "acca", "a3t"),
        r"(?P<v>(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16})(?![A-Za-z0-9])",
    ),
    _rule(
        "aws-secret-key",
        ("secret",),
        _AWS_NAME + r"[\"']?\s*[:=]\s*[\"']?(?P<v>[a-z0-9/+]{40})(?![a-z0-9/+])",
        lower=True,
    ),
    _rule(
        "github-token",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        r"(?P<v>gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
    ),
    _rule("gitlab-token", ("glpat-",), r"(?P<v>glpat-[A-Za-z0-9_-]{20,})"),
    _rule("slack-token", ("xox",), r"(?P<v>xox[abposr]-[A-Za-z0-9-]{10,})"),
    _rule("stripe-key", ("k_live_",), r"(?P<v>[rs]k_live_[A-Za-z0-9]{20,})"),
    _rule("google-api-key", ("aiza",), r"(?P<v>AIza[0-9A-Za-z_-]{35})"),
    _rule("jwt", ("eyj",), r"(?P<v>eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"),
    _rule(
        "bearer-token",
        ("bearer", "basic", "token"),
        r"(?:bearer|basic|token)\s+(?P<v>[a-z0-9._~+/-]{16,}=*)",
        lower=True,
        check=_credential,
    ),
    _rule("url-password", ("://",), r"://[^\s/:@\"'<>]{1,256}:(?P<v>[^\s/@\"'<>]{3,256})@", word_start=False),
    # A connection string's key (Azure storage / Service Bus / Event Hubs, SAS URLs): base64 or
    # URL-encoded, often low in letters, and after names no other rule knows.
    _rule(
        "connection-string-key",
        ("accountkey", "sharedaccesskey", "sig="),
        r"(?:accountkey|sharedaccesskey|sig)\s*=\s*(?P<v>[a-z0-9+/=%_.~-]{8,4096})",
        lower=True,
    ),
    _rule(
        "connection-string-key",
        ("sharedaccesssignature",),
        r"sharedaccesssignature\s*=\s*(?P<v>[^\s;\"'<>]{8,4096})",
        lower=True,
    ),
    _rule(
        "secret-value",
        ("key", "secret", "token", "passw", "pwd", "credential"),
        _SECRET_NAME + r"[a-z0-9_.-]{0,20}[\"']?\s*[:=]\s*[\"']?(?P<v>" + _VALUE + r"{16,512})",
        lower=True,
        word_start=False,  # OPENAI_API_KEY=...: the name is matched from its key word on
        check=_looks_random,
    ),
    # A value whose key names a secret, whatever its entropy: password=hunter2, "token": "abc",
    # DB_PASSWORD: x, 'secret' => 'y', --password z. The name must end the key (max_tokens:,
    # secret_name= and password_file= are not secrets) and the value stops at quotes and separators.
    _rule(
        "named-secret",
        ("passw", "passphrase", "_pwd"),
        r"(?:passw(?:or)?d|passphrase|_pwd)(?![a-z0-9])" + _NAMED_SEP + r"(?P<v>" + _VALUE + r"{3,512})",
        lower=True,
        word_start=False,
        check=_named_value,
    ),
    _rule(
        "named-secret",
        ("secret", "token", "key", "credential"),
        r"(?:secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?)(?![a-z0-9])"
        + _NAMED_SEP
        + r"(?P<v>"
        + _VALUE
        + r"{3,512})",
        lower=True,
        word_start=False,
        check=_named_word,
    ),
    _rule(
        "named-secret",
        ("--pass",),
        r"--pass(?:word|wd)?[ \t]+(?P<v>" + _VALUE + r"{3,512})",
        lower=True,
        check=_named_value,
    ),
)
_NEEDLES = tuple(dict.fromkeys(n for rule in _RULES for n in rule.needles))
# What a column is searched for: a needle holding another (sk-ant- holds sk-, accountkey holds key)
# is found with it, so each scan of the whole column is one needed.
_COLUMN_NEEDLES = tuple(n for n in _NEEDLES if not any(m != n and m in n for m in _NEEDLES))

# What the rules are, as one digest: an IR made under other rules is re-exported, never reused.
RULES_DIGEST = hashlib.sha256(
    repr([(r.kind, r.needles, r.pattern.pattern, r.lower, r.word_start, _ENTROPY_MIN) for r in _RULES]).encode()
).hexdigest()
# When lower-casing changes the text's length (a few non-ASCII letters), the lower rules search
# the text itself with these case-insensitive twins (slower, and only then).
_FOLDED = {i: re.compile(rule.pattern.pattern, re.IGNORECASE) for i, rule in enumerate(_RULES) if rule.lower}


# A base64 run worth decoding: at least 24 characters (18 bytes: "password=hunter2\n" and up), not
# inside a longer word. The lookbehind makes the scan linear: a run is tried from its start only.
_B64 = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{24,}={0,2}")
# The column's bytes mapped to "U" (an upper-case letter), "A" (any other base64 character), NUL
# (between values) or " ": a blob of text has both cases, so only a run of 24+ holding a "U" is a
# candidate (paths, identifiers and hex digests in one case are not), found at C speed.
_B64_TABLE = bytes(
    85 if 65 <= b <= 90 else 65 if chr(b) in "abcdefghijklmnopqrstuvwxyz0123456789+/" else 0 if b == 0 else 32
    for b in range(256)
)
_B64_RUN = b"A" * 24


def _blob_runs(coded: bytes) -> Iterator[int]:
    """Start offsets of the runs of 24+ base64 characters holding an upper-case letter (``coded``: mapped).

    Found with bytes.find (C speed; a regex tried at every offset cost as much as all the needles).
    """
    flat = coded.replace(b"U", b"A")
    size = len(flat)
    at = flat.find(_B64_RUN)
    while at >= 0:
        end = flat.find(b" ", at)
        if end < 0:
            end = size
        nul = flat.find(b"\x00", at, end)
        if nul >= 0:
            end = nul
        if coded.find(b"U", at, end) >= 0:
            yield at
        at = flat.find(_B64_RUN, end)


B64_DECODE_LIMIT = 65_536  # characters of one blob decoded (a larger blob: its first 64 KiB are scanned)
_B64_DEPTH = 2  # base64 inside decoded base64 (a dockerconfigjson's "auth") is decoded once more, no deeper


def _decoded(blob: str) -> str | None:
    """The text a base64 blob encodes, or None when it is not base64 of (mostly printable) text."""
    body = blob.rstrip("=")
    if body.islower() or body.isupper() or body.isdigit():
        # paths, identifiers, hex digests (sha256 of everything): base64 of text has both cases
        # (24 random base64 characters without an upper-case letter: about 1 in 250,000)
        return None
    body = body[:B64_DECODE_LIMIT]
    body = body[: len(body) - len(body) % 4] if len(body) % 4 == 1 else body
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    printable = sum(1 for ch in text if ch.isprintable() or ch in "\n\r\t")
    return text if text and printable >= 0.95 * len(text) else None


def _has_blob(text: str) -> bool:
    """Whether ``text`` holds a base64 blob of text (the cheap half of the test: decoded, not yet scanned)."""
    return any(_decoded(m.group()) is not None for m in _B64.finditer(text))


def _scan(text: str, low: str, depth: int, starts: frozenset[int] = frozenset()) -> list[tuple[int, int, str]]:
    """The secrets' spans in ``text`` (``low`` is its lower-cased form), earlier rules first, none overlapping.

    ``starts``: offsets where a word may start whatever precedes them (where a line break was taken out).
    """
    same = len(low) == len(text)
    spans: list[tuple[int, int, str]] = []
    if any(n in low for n in _NEEDLES):
        for i, rule in enumerate(_RULES):
            if not any(n in low for n in rule.needles):
                continue
            if rule.lower:
                hay, pattern = (low, rule.pattern) if same else (text, _FOLDED[i])
            else:
                hay, pattern = text, rule.pattern
            for m in pattern.finditer(hay):
                start = m.start()
                if (
                    rule.word_start
                    and start > 0
                    and (hay[start - 1].isalnum() or hay[start - 1] == "_")
                    and start not in starts
                ):
                    continue
                vs, ve = m.span("v")
                if rule.check is not None and not rule.check(text[vs:ve]):
                    continue
                if any(vs < e and s < ve for s, e, _ in spans):
                    continue
                spans.append((vs, ve, rule.kind))
    if depth < _B64_DEPTH:
        for m in _B64.finditer(text):
            vs, ve = m.span()
            if any(vs < e and s < ve for s, e, _ in spans):
                continue  # already inside a secret (a JWT, a key after its name)
            inner = _decoded(m.group())
            if inner is not None and _scan(inner, inner.lower(), depth + 1):
                spans.append((vs, ve, "base64-secret"))
    return spans


# A line break inside a run of token characters (a value wrapped by a terminal or a log line limit),
# or its escaped form inside a JSON string (a raw log line shown by show-ref or the report).
_WRAP = re.compile(r"(?<=[A-Za-z0-9_+/=.-])(?:\r?\n|\\r\\n|\\n)(?=[A-Za-z0-9_+/=.-])")


def _split_spans(text: str, depth: int) -> list[tuple[int, int, str]]:
    r"""Secrets cut across lines of one text: found in the text with its wrapping line breaks taken out.

    Only breaks between two token characters are taken out (``password:\n  Login ok`` stays two
    lines), and only a secret a break falls strictly inside counts; its span is mapped back onto
    the text, breaks included.
    """
    breaks = [m.span() for m in _WRAP.finditer(text)]
    if not breaks:
        return []
    flat_starts = [0]
    orig_starts = [0]
    kept: list[str] = []
    at = 0
    for bs, be in breaks:
        kept.append(text[at:bs])
        flat_starts.append(flat_starts[-1] + bs - at)
        orig_starts.append(be)
        at = be
    kept.append(text[at:])
    flat = "".join(kept)
    joins = flat_starts[1:]

    def orig(f: int, end: bool) -> int:
        # an end offset on a join belongs to the line before it, a start offset to the line after it
        k = bisect.bisect_left(flat_starts, f) - 1 if end else bisect.bisect_right(flat_starts, f) - 1
        k = max(k, 0)
        return orig_starts[k] + (f - flat_starts[k])

    out: list[tuple[int, int, str]] = []
    for s, e, kind in _scan(flat, flat.lower(), depth, frozenset(joins)):
        k = bisect.bisect_right(joins, s)
        if k < len(joins) and joins[k] < e:  # a break strictly inside the secret
            out.append((orig(s, False), orig(e, True), kind))
    return out


def _merge(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    spans.sort()
    merged: list[tuple[int, int, str]] = []
    for s, e, kind in spans:
        if merged and s < merged[-1][1]:
            ps, pe, pk = merged[-1]
            merged[-1] = (ps, max(pe, e), pk)
        else:
            merged.append((s, e, kind))
    return merged


def redact(text: str, _depth: int = 0) -> tuple[str, int]:
    """``text`` with every secret replaced by ``[REDACTED:<kind>]``, and how many were replaced.

    Besides the rules' matches: base64 blobs whose decoded text holds a secret (replaced whole),
    and a secret cut across lines of the text (replaced on every line it spans).
    """
    low = text.lower()
    spans = _scan(text, low, _depth)
    if "\n" in text or "\\n" in text:
        spans.extend(_split_spans(text, _depth))
    if not spans:
        return text, 0
    spans = _merge(spans)
    parts: list[str] = []
    at = 0
    for s, e, kind in spans:
        parts.append(text[at:s])
        # the secret's line breaks are kept, so a multi-line key block does not shift line numbers
        parts.append(f"[REDACTED:{kind}]" + "\n" * text.count("\n", s, e))
        at = e
    parts.append(text[at:])
    return "".join(parts), len(spans)


def redact_path(path: str) -> str:
    """A bundle-relative path with each file or directory name redacted: a secret becomes ``REDACTED-<kind>``."""
    parts = path.split("/")
    out = []
    for part in parts:
        text, n = redact(part)
        out.append(re.sub(r"\[REDACTED:([a-z0-9-]+)\]", PATH_MARKER + r"\1", text) if n else part)
    return "/".join(out)


def display_paths(paths: Sequence[str]) -> dict[str, str]:
    """Map raw path -> how it is shown (IR ``source_path``, refs, the report), for the paths whose names hold a secret.

    The display form is what every artifact stores; the raw path is found again from it with the
    bundle's manifest (:func:`raw_paths`), so refs still resolve to, and hash-check, the raw bytes.
    Two raw paths that would show the same are told apart by a ``-2``, ``-3``... on the later one's
    first marker (in manifest order, which is sorted and frozen: the same bundle always shows the same).
    """
    changed, _ = redact_column(list(paths))
    if changed is None:
        return {}
    shown: dict[str, str] = {}
    taken = set(paths)
    for raw, red in zip(paths, changed, strict=True):
        if red is None or red == raw:
            continue
        display = redact_path(raw)
        if display == raw:
            continue
        n = 1
        candidate = display
        while candidate in taken:
            n += 1
            candidate = re.sub(r"(" + PATH_MARKER + r"[a-z0-9-]+)", rf"\1-{n}", display, count=1)
        taken.add(candidate)
        shown[raw] = candidate
    return shown


def raw_paths(paths: Sequence[str]) -> dict[str, str]:
    """The inverse of :func:`display_paths`: display path -> raw path (only for redacted ones)."""
    return {display: raw for raw, display in display_paths(paths).items()}


def redact_column(values: Sequence[str | None]) -> tuple[list[str | None] | None, int]:
    """:func:`redact` over one column of a cell's events: (the new column, or None when unchanged; count).

    The export's one entry point (both paths call it on ``text`` and ``target``). The column is
    joined and lower-cased once, each needle looked for in it at C speed, and only the values that
    hold one go through :func:`redact` (on the demo 152 of 6,404 texts, none of them changed).
    """
    if not values:
        return None, 0
    joined = "\x00".join("" if v is None else v for v in values)  # no needle holds NUL: none spans two values
    low = joined.lower()
    if len(low) != len(joined) or joined.count("\x00") != len(values) - 1:
        return _one_by_one(values)  # lower-casing moved offsets (a few non-ASCII letters), or a value holds NUL
    if "\n" in low:
        # the needles are looked for with the line breaks taken out, so a needle one cuts (s\nk-proj-...)
        # is found too (a superset: every "\r" goes, which only adds candidates; the IR's text is
        # decoded, so the escaped "\\n" of a raw line is redact's own business)
        low = low.replace("\n", "")
        if "\r" in low:
            low = low.replace("\r", "")
    present = [n for n in _COLUMN_NEEDLES if n in low]
    hits: set[int] = set()
    if present:
        starts = [0]
        for part in low.split("\x00"):
            starts.append(starts[-1] + len(part) + 1)
        for needle in present:
            at = low.find(needle)
            while at >= 0:
                i = bisect.bisect_right(starts, at) - 1
                hits.add(i)
                at = low.find(needle, starts[i + 1])  # the next value: one hit per value is enough
    # Values holding a run of 24+ base64 characters (both cases) are decoded and scanned (by redact).
    coded = joined.encode("utf-8", "replace").translate(_B64_TABLE)
    if b"U" in coded:
        byte_starts: list[int] | None = None
        for at in _blob_runs(coded):
            if byte_starts is None:
                byte_starts = [0]
                for seg in coded.split(b"\x00"):
                    byte_starts.append(byte_starts[-1] + len(seg) + 1)
            i = bisect.bisect_right(byte_starts, at) - 1
            if i not in hits and _has_blob(values[i] or ""):
                hits.add(i)
    if not hits:
        return None, 0
    out: list[str | None] = list(values)
    total = 0
    for i in sorted(hits):
        text = out[i]
        if text is not None:
            out[i], n = redact(text)
            total += n
    return (out, total) if total else (None, 0)


def _one_by_one(values: Sequence[str | None]) -> tuple[list[str | None] | None, int]:
    out: list[str | None] = []
    total = 0
    for v in values:
        if v is None:
            out.append(None)
            continue
        text, n = redact(v)
        out.append(text)
        total += n
    return (out, total) if total else (None, 0)
