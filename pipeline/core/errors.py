"""One error hierarchy; the CLI turns each into one line and the contract's exit code.

Exit codes: 0 success; 1 findings; 2 bad input or usage; 3 blocked
(a block receipt was written); 4 refused by a gate's compare-and-set. An unexpected
exception (a bug) is one line and exit 70 (EX_SOFTWARE) at the CLI boundary.
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_BLOCKED = 3
EXIT_NEEDS_REBASE = 4
EXIT_INTERNAL = 70  # not in the contract: a bug in lunasol (EX_SOFTWARE), never mistaken for findings


class LunasolError(Exception):
    """Base of every error lunasol raises on purpose."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def one_line(self) -> str:
        """The single line shown to the user (newlines folded)."""
        return " ".join(self.message.split())


class BadInput(LunasolError):
    """Malformed or inconsistent input: bundle, flags, files. Exit 2."""

    exit_code = EXIT_BAD_INPUT


class BundleError(BadInput):
    """A bundle is missing parts, changed since freezing, or unsafe to read."""


class Blocked(LunasolError):
    """The run cannot go on; a block receipt was (or must be) written. Exit 3.

    Carries what blocked, what was tried (with real outcomes) and the command that unblocks.
    """

    exit_code = EXIT_BLOCKED

    def __init__(
        self,
        message: str,
        *,
        reason: str = "blocked",
        tried: list[dict[str, Any]] | None = None,
        unblock: str = "",
        **data: Any,
    ) -> None:
        super().__init__(message, **data)
        self.reason = reason
        self.tried = tried or []
        self.unblock = unblock


class NeedsRebase(LunasolError):
    """A gate's compare-and-set saw a stale digest or revision. Exit 4."""

    exit_code = EXIT_NEEDS_REBASE


class Findings(LunasolError):
    """Not a failure of the tool: the check found something (changes, invalid cards, diffs). Exit 1."""

    exit_code = EXIT_FINDINGS
