"""A base URL as lunasol shows and keeps it: credentials in it replaced by a marker.

``--api-base https://user:pw@proxy/v1`` or ``...?api-key=...`` puts a credential in the URL, which
httpx and the openai SDK accept. lunasol keeps the URL in ``run.json`` (for ``propose``, ``status
--poll`` and the resume command) and names it in error lines; those are shared (a run directory, a
pasted error), so they hold :func:`shown_url`, never the credential. A kept URL with a marker is
not usable: the real one comes from ``--api-base`` or ``LUNASOL_API_BASE`` (:func:`unusable` says so).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from pipeline.core.errors import BadInput

MARK = "[REDACTED:"
"""What every replaced part starts with (the IR's marker, pipeline.ir.redact)."""

PASSWORD_MARK = "[REDACTED:url-password]"
VALUE_MARK = "[REDACTED:secret-value]"

# a query parameter carries a credential when the last word of its name is one of these (api-key, apiKey,
# access_token, X-Amz-Signature, sig); "monkey" or "keyboard" do not
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "sig", "signature", "auth", "credential",
     "credentials"}
)  # fmt: skip
_WORDS = re.compile(r"[_\-.]|(?<=[a-z])(?=[A-Z])")

ENV_API_BASE = "LUNASOL_API_BASE"
RESUME_API_BASE = f'"${{{ENV_API_BASE}:?set it to the --api-base of this run, credentials included}}"'
"""The ``--api-base`` value of a printed command whose URL was kept without its credentials: the
shell fills it from the environment, or stops with that message when it is unset."""


def shown_url(url: str) -> str:
    """``url`` with its userinfo password (or a bare userinfo, often a token) and secret query values marked.

    Everything else is kept byte for byte, so a URL without credentials comes back unchanged.
    """
    if "," in url and url.count("://") > 1:  # a fleet's comma list (pipeline.models.fleet): each URL alone
        return ",".join(shown_url(part) for part in url.split(","))
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{PASSWORD_MARK}@{hostport}" if colon else f"{PASSWORD_MARK}@{hostport}"
    query = "&".join(_shown_param(p) for p in parts.query.split("&")) if parts.query else parts.query
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def shown_urls(text: str) -> str:
    """``text`` (a provider's error message, say) with every URL in it as :func:`shown_url` keeps it."""
    return _URL.sub(lambda m: shown_url(m.group(0)), text) if "://" in text else text


def _shown_param(param: str) -> str:
    name, eq, value = param.partition("=")
    secret = _WORDS.split(name)[-1].lower() in _SECRET_WORDS
    return f"{name}={VALUE_MARK}" if eq and value and secret else param


def is_shown(url: str | None) -> bool:
    """True when ``url`` was kept by :func:`shown_url` with something replaced (it cannot be used as is)."""
    return bool(url) and MARK in str(url)


def unusable(kept: str) -> BadInput:
    """The one-line error for a kept URL that must be given again, credentials included."""
    return BadInput(
        f"run.json keeps the run's --api-base without its credentials ({kept}); "
        f"pass --api-base URL or set {ENV_API_BASE}"
    )
