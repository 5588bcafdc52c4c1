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
around it (``Bearer``, ``api_key=``) stays, so the text still reads as what happened.

Why these patterns and not Yelp's detect-secrets: on the demo's 6,404 events (1.2 MB of text)
its ``scan_line`` took 34 s and its 46 plugin regexes 1.5 s (2.7 s as one alternation), against
0.64 s for the whole export. The rules below (literal-first patterns behind a per-column needle
check) cost 1.04x on a 213,000-event export (bench/README.md). They cover the token formats of
its plugins that occur in agent logs, plus high-entropy values after key-like names.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
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
}

_AWS_NAME = r"(?:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)"
_SECRET_NAME = (
    r"(?:api[_-]?key|apikey|secret|token|passw(?:or)?d|pwd|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?)"
)
_VALUE = r"[^\s\"',;&<>{}\[\]()]"  # what a value after a name may hold (stops at quotes, separators, brackets)
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
    _rule(
        "secret-value",
        ("key", "secret", "token", "passw", "pwd", "credential"),
        _SECRET_NAME + r"[a-z0-9_.-]{0,20}[\"']?\s*[:=]\s*[\"']?(?P<v>" + _VALUE + r"{16,512})",
        lower=True,
        word_start=False,  # OPENAI_API_KEY=...: the name is matched from its key word on
        check=_looks_random,
    ),
)
_NEEDLES = tuple(dict.fromkeys(n for rule in _RULES for n in rule.needles))

# What the rules are, as one digest: an IR made under other rules is re-exported, never reused.
RULES_DIGEST = hashlib.sha256(
    repr([(r.kind, r.needles, r.pattern.pattern, r.lower, r.word_start, _ENTROPY_MIN) for r in _RULES]).encode()
).hexdigest()
# When lower-casing changes the text's length (a few non-ASCII letters), the lower rules search
# the text itself with these case-insensitive twins (slower, and only then).
_FOLDED = {rule.kind: re.compile(rule.pattern.pattern, re.IGNORECASE) for rule in _RULES if rule.lower}


def redact(text: str) -> tuple[str, int]:
    """``text`` with every secret replaced by ``[REDACTED:<kind>]``, and how many were replaced."""
    low = text.lower()
    if not any(n in low for n in _NEEDLES):
        return text, 0
    same = len(low) == len(text)
    spans: list[tuple[int, int, str]] = []
    for rule in _RULES:
        if not any(n in low for n in rule.needles):
            continue
        if rule.lower:
            hay, pattern = (low, rule.pattern) if same else (text, _FOLDED[rule.kind])
        else:
            hay, pattern = text, rule.pattern
        for m in pattern.finditer(hay):
            start = m.start()
            if rule.word_start and start > 0 and (hay[start - 1].isalnum() or hay[start - 1] == "_"):
                continue
            vs, ve = m.span("v")
            if rule.check is not None and not rule.check(text[vs:ve]):
                continue
            if any(vs < e and s < ve for s, e, _ in spans):
                continue
            spans.append((vs, ve, rule.kind))
    if not spans:
        return text, 0
    spans.sort()
    parts: list[str] = []
    at = 0
    for s, e, kind in spans:
        parts.append(text[at:s])
        # the secret's line breaks are kept, so a multi-line key block does not shift line numbers
        parts.append(f"[REDACTED:{kind}]" + "\n" * text.count("\n", s, e))
        at = e
    parts.append(text[at:])
    return "".join(parts), len(spans)


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
    if len(low) != len(joined):  # lower-casing moved offsets (a few non-ASCII letters): value by value
        return _one_by_one(values)
    present = [n for n in _NEEDLES if n in low]
    if not present:
        return None, 0
    starts = [0]
    for v in values:
        starts.append(starts[-1] + (0 if v is None else len(v)) + 1)
    hits: set[int] = set()
    for needle in present:
        at = low.find(needle)
        while at >= 0:
            i = bisect.bisect_right(starts, at) - 1
            hits.add(i)
            at = low.find(needle, starts[i + 1])  # the next value: one hit per value is enough
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
