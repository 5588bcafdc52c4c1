"""An answer model's JSON schema as plain prompt text: every field, what it means, what is required.

Some servers turn a ``tools`` definition or a ``json_schema`` response format into a grammar and never
show it to the model (llama-cpp-python's server: its prompt tokens equal the templated messages
exactly). A model that is only constrained, never told, answers the grammar's smallest shape
(``{"patterns": [], "rejected_candidates": []}``). So every role's prompt carries this text too,
generated from the same pydantic model the answer is validated against (one source of truth).

A model says what its "nothing found" answer must look like with ``json_schema_extra={"nothing_found":
"..."}`` in its ``model_config``; it is printed last.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

NOTHING_FOUND = "nothing_found"


@functools.lru_cache(maxsize=32)
def schema_text(model: type[BaseModel]) -> str:
    """The prompt text of ``model``'s answer schema (made once per model)."""
    schema = model.model_json_schema()
    defs: dict[str, Any] = schema.get("$defs", {})
    lines = ["Answer with ONE JSON object, exactly these fields (* = required; no other field is accepted):"]
    _fields(schema, defs, lines, "", (model.__name__,))
    nothing = schema.get(NOTHING_FOUND)
    if nothing:
        lines.append(f"Nothing found: {nothing}")
    return "\n".join(lines)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        return defs.get(name, {}), name
    return node, None


def _type(node: dict[str, Any], defs: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(type words, the object schema to expand below or None, its def name)."""
    node, name = _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) == 1:
            words, sub, sub_name = _type(options[0], defs)
            return (f"{words} or null" if nullable else words), sub, sub_name
        return " or ".join(_type(o, defs)[0] for o in options) + (" or null" if nullable else ""), None, None
    if "enum" in node:
        return "one of " + " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in node["enum"]), None, None
    if "const" in node:
        return f'exactly "{node["const"]}"', None, None
    kind = node.get("type")
    if kind == "array":
        words, sub, sub_name = _type(node.get("items", {}), defs)
        least = node.get("minItems") or 0
        head = "non-empty list" if least == 1 else f"list (at least {least})" if least else "list"
        return f"{head} of {words}", sub, sub_name
    if kind == "object" or "properties" in node:
        return "object", node, name
    if kind == "string" and node.get("minLength"):
        least = node["minLength"]
        return ("non-empty string" if least == 1 else f"string, at least {least} characters"), None, None
    return str(kind or "any"), None, None


def _fields(node: dict[str, Any], defs: dict[str, Any], lines: list[str], indent: str, path: tuple[str, ...]) -> None:
    required = set(node.get("required", []))
    for field, spec in (node.get("properties") or {}).items():
        words, sub, name = _type(spec, defs)
        mark = "*" if field in required else ""
        desc = spec.get("description") or (sub or {}).get("description") or ""
        if not desc and name:
            desc = str(defs.get(name, {}).get("description") or "")
        line = f"{indent}- {field}{mark} ({words})"
        lines.append(f"{line}: {' '.join(desc.split())}" if desc else line)
        if sub is not None and (name is None or name not in path):  # a recursive model is expanded once
            _fields(sub, defs, lines, indent + "  ", (*path, name or field))
