"""Instructor's request shaping, answer parsing and re-asks, without instructor (for replay).

A replay key is the sha256 of the request instructor hands to the completion function, so a
replay must build the same request instructor builds. These pure functions do it for the modes
lunasol supports (``tools``, ``json_schema``, ``json``, ``md_json``), following instructor 1.17's
OpenAI handlers (``instructor.v2.providers.openai.handlers``): the schema or tool added to the
request, the stored answer parsed strictly into the role's model, and on a parse failure the
re-ask messages instructor appends. Replay uses them instead of importing instructor, litellm and
openai (seconds of start-up for work that is a dictionary lookup); live and record modes keep
instructor. ``tests/models/test_models_shaping.py`` compares every function here with instructor
itself for every role model and mode: the guard that the two never drift.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Awaitable, Callable
from textwrap import dedent
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)

MODES = ("tools", "json_schema", "json", "md_json")
_MODE_VALUES = {
    "tools": "tool_call",
    "json_schema": "json_schema_mode",
    "json": "json_mode",
    "md_json": "markdown_json_mode",
}
"""Our mode names -> ``instructor.Mode`` values (they appear in instructor's parse errors)."""

MD_JSON_ASK = "Return the correct JSON response within a ```json codeblock. not the JSON_SCHEMA"


class ResponseParsingError(ValueError):
    """The answer has no part to parse (instructor's ``ResponseParsingError``: same name, same text)."""

    def __init__(self, message: str, mode: str | None = None) -> None:
        super().__init__(f"{message} (mode: {mode})" if mode else message)


class IncompleteOutputException(Exception):
    """The model stopped at its token limit (``finish_reason == "length"``); instructor never re-asks it."""

    def __init__(self) -> None:
        super().__init__("The output is incomplete due to a max_tokens length limit.")


class RefusedAnswer(AssertionError):
    """The model refused (``message.refusal``); instructor raises it unretried in tools mode."""


class Unretried(Exception):
    """A parse failure instructor does not re-ask (its extraction limits)."""


class InstructorRetryException(Exception):
    """What instructor raises for a failure it does not re-ask, when no re-asked failure came before."""


class AskFailed(Exception):
    """The answer could not be parsed: ``shown`` is the failure the live path reports (the last re-asked one)."""

    def __init__(self, shown: BaseException) -> None:
        super().__init__(str(shown))
        self.shown = shown


# -- the request ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _model_schema(response_model: type[BaseModel]) -> str:
    # Generated once per model class (~3 ms each: a 1,000-cell dry run asked 1,036 times for one schema).
    return json.dumps(response_model.model_json_schema(), ensure_ascii=False)


@functools.lru_cache(maxsize=64)
def _tool_schema(response_model: type[BaseModel]) -> dict[str, Any]:
    # instructor's generate_openai_schema: the model's JSON schema as a function's parameters,
    # docstring params folded into property descriptions.
    schema = json.loads(_model_schema(response_model))
    parameters = {k: v for k, v in schema.items() if k not in ("title", "description")}
    short = None
    if response_model.__doc__:
        # docstring_parser loads only for a model with a docstring (startup cost of a replay).
        from docstring_parser import parse

        doc = parse(response_model.__doc__)
        short = doc.short_description
        for param in doc.params:
            name, description = param.arg_name, param.description
            if name in parameters["properties"] and description:
                parameters["properties"][name].setdefault("description", description)
    parameters["required"] = sorted(schema.get("required", []))
    description = schema.get("description") or (
        short or f"Correctly extracted `{response_model.__name__}` with all the required parameters with correct types"
    )
    return {"name": schema["title"], "description": description, "parameters": parameters}


@functools.lru_cache(maxsize=64)
def _schema_text(response_model: type[BaseModel]) -> str:
    schema = json.loads(_model_schema(response_model))
    return dedent(
        f"""
            As a genius expert, your task is to understand the content and provide
            the parsed objects in json that match the following json_schema:\n

            {json.dumps(schema, indent=2, ensure_ascii=False)}

            Make sure to return an instance of the JSON, not the schema itself
            """
    )


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    # The schema text joins the first system message, or becomes one (instructor's JSON handlers).
    out = [dict(m) for m in messages]
    if out and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": text})
    elif out and isinstance(out[0]["content"], str):
        out[0]["content"] += f"\n\n{text}"
    elif out and isinstance(out[0]["content"], list):
        out[0]["content"] = [dict(p) if isinstance(p, dict) else p for p in out[0]["content"]]
        out[0]["content"][0]["text"] += f"\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def _merge_consecutive(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # instructor's merge_consecutive_messages, for the plain-text messages lunasol sends.
    if not messages:
        return []
    flat = all(isinstance(m.get("content", ""), str) for m in messages)
    merged: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "user")
        content = message.get("content", "")
        plain = set(message).issubset({"role", "content"})
        if content is None:
            content = ""
        elif isinstance(content, list):
            content = list(content)
        if not flat and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if merged and role == merged[-1]["role"] and plain and set(merged[-1]).issubset({"role", "content"}):
            if flat:
                merged[-1]["content"] += f"\n\n{content}"
            elif isinstance(content, list):
                merged[-1]["content"].extend(content)
            else:
                merged[-1]["content"].append(content)
        else:
            merged.append({**message, "role": role, "content": content})
    return merged


def shape_request(
    messages: list[dict[str, Any]], response_model: type[BaseModel], mode: str = "tools", **params: Any
) -> dict[str, Any]:
    """The kwargs instructor hands the completion function for these messages in ``mode``.

    ``params`` (temperature, max_tokens...) pass through unchanged, as instructor passes them.
    """
    if mode not in MODES:
        raise ValueError(f"unknown instructor mode {mode!r} (one of {', '.join(MODES)})")
    kwargs: dict[str, Any] = {**params}
    if mode == "tools":
        tool = copy.deepcopy(_tool_schema(response_model))  # the cached schema stays as made
        kwargs["messages"] = list(messages)
        kwargs["tools"] = [{"type": "function", "function": tool}]
        kwargs["tool_choice"] = {"type": "function", "function": {"name": tool["name"]}}
    elif mode == "json_schema":
        kwargs["messages"] = list(messages)
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": response_model.__name__, "schema": json.loads(_model_schema(response_model))},
        }
    else:
        shaped = _with_system_text(messages, _schema_text(response_model))
        if mode == "md_json":
            shaped.append({"role": "user", "content": MD_JSON_ASK})
        else:
            kwargs["response_format"] = {"type": "json_object"}
        kwargs["messages"] = _merge_consecutive(shaped)
    # instructor's message converter rebuilds each message as {role, content, **rest}.
    kwargs["messages"] = [_converted(m) for m in kwargs["messages"]]
    return kwargs


def _converted(message: dict[str, Any]) -> dict[str, Any]:
    # An empty content becomes an empty part list there (lunasol's messages always have text).
    return {**message, "role": message["role"], "content": message["content"] or []}


# -- the answer -------------------------------------------------------------------------------------


def _message(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else {}


def _normal_arguments(args: Any) -> str:
    # litellm's Function: missing arguments become "", an object becomes its JSON text.
    if args is None:
        return ""
    return args if isinstance(args, str) else json.dumps(args)


def extract_json_from_codeblock(content: str) -> str:
    """The last complete JSON object or array in ``content`` (instructor's MD_JSON extraction)."""
    if len(content) > 1024 * 1024:
        raise Unretried("JSON extraction input exceeds the 1 MiB character limit")
    decoder = json.JSONDecoder()
    last: str | None = None
    consumed = 0
    budget = 16 * len(content)
    for index, char in enumerate(content):
        if index < consumed or char not in "{[":
            continue
        if budget < len(content) - index:
            raise Unretried("JSON extraction malformed-input work limit exceeded")
        try:
            _value, end = decoder.raw_decode(content, index)
        except json.JSONDecodeError:
            budget -= len(content) - index
            continue
        except RecursionError:
            raise Unretried("JSON extraction nesting limit exceeded") from None
        budget -= end - index
        last = content[index:end]
        consumed = end
    return last if last is not None else content


def parse_answer(body: dict[str, Any], response_model: type[T], mode: str) -> T:
    """The stored answer parsed strictly into ``response_model``, as instructor parses it.

    Raises what instructor re-asks on (:class:`pydantic.ValidationError`,
    :class:`ResponseParsingError`) and what it does not (:class:`IncompleteOutputException`,
    :class:`RefusedAnswer`, :class:`Unretried`).
    """
    choices = body.get("choices") or []
    if not choices:
        raise ResponseParsingError("No choices in OpenAI response", mode=_MODE_VALUES[mode])
    if isinstance(choices[0], dict) and choices[0].get("finish_reason") == "length":
        raise IncompleteOutputException()
    message = _message(body)
    if mode == "tools":
        refusal = message.get("refusal")
        if refusal is not None:
            raise RefusedAnswer(f"Unable to generate a response due to {refusal}")
        tool_calls = message.get("tool_calls") or []
        if tool_calls:
            text = _normal_arguments((tool_calls[0].get("function") or {}).get("arguments"))
        elif message.get("function_call") is not None:
            text = _normal_arguments(message["function_call"].get("arguments"))
        else:
            raise ResponseParsingError("No tool calls or function call found in response", mode="TOOLS")
    else:
        text = message.get("content") or ""
        if mode == "md_json":
            text = extract_json_from_codeblock(text)
    return response_model.model_validate_json(text, strict=True)


# -- the re-ask -------------------------------------------------------------------------------------


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    # litellm's ChatCompletionMessageToolCall dump: function {arguments, name}, id, type, extras kept.
    function = dict(call.get("function") or {})
    arguments = _normal_arguments(function.get("arguments"))
    out = {**call, "function": {**function, "arguments": arguments, "name": function.get("name")}}
    out.setdefault("id", None)
    out["type"] = call.get("type") or "function"
    return out


def dump_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message instructor puts back into a re-ask (its ``dump_message`` of litellm's message)."""
    out: dict[str, Any] = {"role": message.get("role") or "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):  # litellm turns an empty list into None
        out["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
    function_call = message.get("function_call")
    if function_call is not None:
        arguments = _normal_arguments(function_call.get("arguments"))
        out["content"] += json.dumps({"arguments": arguments, "name": function_call.get("name")})
    return out


def as_litellm_holds(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with each choice's message as litellm's Message holds it (for a response built without litellm).

    Instructor puts the answer's message back into a re-ask from the response object; litellm
    normalises tool-call arguments (an object becomes its JSON text, a missing one "") and an empty
    tool-call list (None). The openai SDK's objects keep what the server sent, so a re-ask through
    them would differ from a replay's (:func:`reask`) where a server answers loosely.
    """
    choices = body.get("choices")
    if not isinstance(choices, list):
        return body
    out = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            out.append(choice)
            continue
        message = dict(message)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_tool_call(c) for c in calls if isinstance(c, dict)] or None
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            message["function_call"] = {
                **function_call,
                "arguments": _normal_arguments(function_call.get("arguments")),
                "name": function_call.get("name"),
            }
        out.append({**choice, "message": message})
    return {**body, "choices": out}


def reask(kwargs: dict[str, Any], body: dict[str, Any], error: Exception, mode: str) -> dict[str, Any]:
    """The next request after a parse failure: the previous answer and the error appended (instructor's reask)."""
    message = _message(body)
    messages = [*kwargs["messages"], dump_message(message)]
    if mode == "tools":
        text = f"Validation Error found:\n{error}\nRecall the function correctly, fix the errors"
        calls = message.get("tool_calls") or []
        if not calls:
            messages.append({"role": "user", "content": text})
        for call in calls:
            function = call.get("function") or {}
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id"), "name": function.get("name"), "content": text}
            )
    else:
        messages.append(
            {"role": "user", "content": f"Correct your JSON ONLY RESPONSE, based on the following errors:\n{error}"}
        )
    return {**kwargs, "messages": messages}


_REASKED = (ValidationError, json.JSONDecodeError, ResponseParsingError)


async def ask(
    complete: Callable[..., Awaitable[dict[str, Any]]],
    messages: list[dict[str, Any]],
    response_model: type[T],
    mode: str,
    *,
    max_retries: int,
    **params: Any,
) -> T:
    """What instructor's ``create(response_model=..., max_retries=...)`` does, over ``complete`` (which returns a body).

    Re-asks parse failures up to ``max_retries`` times; raises :class:`AskFailed` with the failure
    instructor's ``InstructorRetryException`` leads to when they are spent or a failure is not
    re-asked, and :class:`IncompleteOutputException` as instructor does (unwrapped). Whatever
    ``complete`` raises passes through.
    """
    kwargs = shape_request(messages, response_model, mode, **params)
    last: Exception | None = None
    for _attempt in range(max(max_retries, 0) + 1):
        body = await complete(**kwargs)
        try:
            return parse_answer(body, response_model, mode)
        except _REASKED as exc:
            last = exc
            kwargs = reask(kwargs, body, exc, mode)
        except (RefusedAnswer, Unretried) as exc:
            raise AskFailed(last or InstructorRetryException(str(exc))) from exc
    assert last is not None
    raise AskFailed(last)
