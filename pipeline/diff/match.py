"""Matching outputs of two runs by what they say and cite, never by their ids.

Ids (P-.., W-.., G-..) are numbered per run, so two runs that found the same thing may
number it differently, and equal ids may name different things. Every matcher here
scores candidate pairs by overlap of what they cite (event ids, cells, refs) or by
language-independent text similarity, then pairs greedily from the best score down —
deterministic (ties broken by position) and easy to explain in a review.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from pipeline.core.refs import REF_IN_TEXT

T = TypeVar("T")

# Event ids follow pipeline.ir.schema.event_id: '<cell_id>-e<seq, 4+ digits>'.
EVENT_ID_RE = re.compile(r"[A-Za-z0-9_.:/-]+?-e\d{4,}\b")


def jaccard(a: Iterable[Any], b: Iterable[Any]) -> float:
    """|A ∩ B| / |A ∪ B|; two empty sets count as identical (1.0)."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def _norm_text(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def text_similarity(a: str, b: str) -> float:
    """Jaccard of character bigrams: works the same for English and Chinese, no tokenizer needed."""
    na, nb = _norm_text(a), _norm_text(b)
    if na == nb:
        return 1.0
    ga = {na[i : i + 2] for i in range(max(len(na) - 1, 1))}
    gb = {nb[i : i + 2] for i in range(max(len(nb) - 1, 1))}
    return jaccard(ga, gb)


# Fields that name runs and task families rather than cite evidence: an imported run's id may look
# like a ref (OpenHands' ``output.jsonl#L2``, one run per line) without being one.
NAME_KEYS = frozenset({"runs", "run_id", "tasks", "task_id"})


def strings_in(obj: Any, skip: frozenset[str] = frozenset()) -> Iterable[str]:
    """Every string leaf of a JSON-like value, depth first (values under the keys ``skip`` left out)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            if key not in skip:
                yield from strings_in(obj[key], skip)
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from strings_in(item, skip)


def cited_ids(obj: Any) -> set[str]:
    """Event ids and refs cited anywhere inside a card (statement text included; run and task names not)."""
    found: set[str] = set()
    for s in strings_in(obj, NAME_KEYS):
        # Every event id holds "-e" and every ref "#L": most strings (ids, kinds, words) need no scan.
        if "-e" in s:
            found.update(m.group(0) for m in EVENT_ID_RE.finditer(s))
        if "#L" in s:
            found.update(m.group(0) for m in REF_IN_TEXT.finditer(s))
    return found


def id_list(value: Any, *keys: str) -> list[str]:
    """Ids from a list of strings or of dicts (first of ``keys`` present), or from one string."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict):
                for key in keys:
                    if isinstance(item.get(key), str):
                        out.append(item[key])
                        break
    return out


def greedy_match(
    a_items: Sequence[T],
    b_items: Sequence[T],
    score: Callable[[T, T], float | None],
    threshold: float,
) -> tuple[list[tuple[int, int, float]], list[int], list[int]]:
    """Pair items best score first; a score of None or below ``threshold`` never pairs.

    Returns (pairs as (index_a, index_b, score), unmatched indexes of A, unmatched of B).
    """
    candidates: list[tuple[float, int, int]] = []
    for i, a in enumerate(a_items):
        for j, b in enumerate(b_items):
            s = score(a, b)
            if s is not None and s >= threshold:
                candidates.append((s, i, j))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    used_a: set[int] = set()
    used_b: set[int] = set()
    pairs: list[tuple[int, int, float]] = []
    for s, i, j in candidates:
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        pairs.append((i, j, round(s, 4)))
    pairs.sort()
    return (
        pairs,
        [i for i in range(len(a_items)) if i not in used_a],
        [j for j in range(len(b_items)) if j not in used_b],
    )


class FieldChange(BaseModel):
    """One field that differs; for lists of plain values, what was added and removed."""

    path: str
    a: Any = None
    b: Any = None
    added: list[Any] | None = None
    removed: list[Any] | None = None


def _plain(values: list[Any]) -> bool:
    return all(isinstance(v, str | int | float | bool) or v is None for v in values)


def field_changes(a: Any, b: Any, *, ignore: frozenset[str] = frozenset(), path: str = "") -> list[FieldChange]:
    """Field-by-field differences of two JSON-like values (keys in ``ignore`` skipped at any depth)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[FieldChange] = []
        for key in sorted(set(a) | set(b), key=str):
            if key in ignore:
                continue
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out.append(FieldChange(path=sub, a=None, b=b[key]))
            elif key not in b:
                out.append(FieldChange(path=sub, a=a[key], b=None))
            else:
                out.extend(field_changes(a[key], b[key], ignore=ignore, path=sub))
        return out
    if a == b:
        return []
    if isinstance(a, list) and isinstance(b, list) and _plain(a) and _plain(b):
        sa, sb = set(a), set(b)
        added = sorted((v for v in sb - sa), key=str)
        removed = sorted((v for v in sa - sb), key=str)
        return [FieldChange(path=path or ".", a=a, b=b, added=added, removed=removed)]
    return [FieldChange(path=path or ".", a=a, b=b)]
