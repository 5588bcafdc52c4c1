"""The guard that lunasol's instructor-free replay never drifts from instructor itself.

``pipeline.models.shaping`` rebuilds instructor's requests, parsing and re-asks so a replay needs
neither instructor nor litellm. Every test here runs instructor (over a scripted completion
function, no network) beside it and asks for the same replay keys, values and error lines: for
every role's output model, every mode lunasol supports, first requests, re-asks and exhaustion.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.artifacts.proposal_card import ProposalList
from pipeline.followup.judge import JudgeAnswer
from pipeline.luna.patterns import LunaAnswer
from pipeline.models import shaping
from pipeline.models.exchange import response_from
from pipeline.models.modes import INSTRUCTOR_MODES
from pipeline.models.store import canonical_request, request_key
from pipeline.models.transport import describe, load_litellm
from pipeline.sol.cards import ReduceAnswer, SolAnswer

ROOT = Path(__file__).resolve().parents[2]
DEMOS = [ROOT / "fixtures" / "recordings" / "h0-demo", ROOT / "fixtures" / "recordings" / "h5-demo"]
ROLE_MODELS: list[type[BaseModel]] = [LunaAnswer, SolAnswer, ReduceAnswer, ProposalList, JudgeAnswer]
PARAMS = {"temperature": 0.0, "max_tokens": 4096}


class Documented(BaseModel):
    """A model whose docstring documents its fields.

    Args:
        name: what it is called
        count: how many there are
    """

    name: str
    count: int


class Bare(BaseModel):
    name: str
    count: int = 0


MODELS = [*ROLE_MODELS, Documented, Bare]


def _messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a role. {{ not a template }}"},
        {"role": "user", "content": "The log:\nC001-e0001 read a file\n"},
    ]


async def _instructor_run(
    bodies: list[dict[str, Any]],
    model: type[BaseModel],
    mode: str,
    messages: list[dict[str, Any]],
    retries: int,
    openai_sdk: bool = False,
) -> tuple[list[dict[str, Any]], Any, BaseException | None]:
    """What instructor sends (every attempt) and returns for scripted answer bodies.

    ``openai_sdk``: the bodies reach instructor as the live openai-SDK client builds them (the SDK's
    ChatCompletion), else as litellm's ModelResponse.
    """
    import instructor
    from instructor.core import InstructorRetryException

    load_litellm()
    sent: list[dict[str, Any]] = []
    queue = list(bodies)

    async def complete(**kwargs: Any) -> Any:
        sent.append(json.loads(json.dumps(kwargs, default=lambda o: o.model_dump())))
        return response_from(queue.pop(0), openai_sdk=openai_sdk)

    client: Any = instructor.from_litellm(complete, mode=getattr(instructor.Mode, INSTRUCTOR_MODES[mode]))
    try:
        obj = await client.chat.completions.create(
            response_model=model, messages=[dict(m) for m in messages], max_retries=retries, **PARAMS
        )
    except InstructorRetryException as exc:
        attempts = exc.failed_attempts or []
        return sent, None, getattr(attempts[-1], "exception", None) if attempts else exc
    except Exception as exc:
        return sent, None, exc
    return sent, model.model_validate(obj.model_dump()), None


async def _lunasol_run(
    bodies: list[dict[str, Any]], model: type[BaseModel], mode: str, messages: list[dict[str, Any]], retries: int
) -> tuple[list[dict[str, Any]], Any, BaseException | None]:
    sent: list[dict[str, Any]] = []
    queue = list(bodies)

    async def complete(**kwargs: Any) -> dict[str, Any]:
        sent.append(json.loads(json.dumps(kwargs)))
        return queue.pop(0)

    try:
        obj = await shaping.ask(complete, [dict(m) for m in messages], model, mode, max_retries=retries, **PARAMS)
    except shaping.AskFailed as exc:
        return sent, None, exc.shown
    except Exception as exc:
        return sent, None, exc
    return sent, model.model_validate(obj.model_dump()), None


def _keys(sent: list[dict[str, Any]], mode: str) -> list[str]:
    return [request_key(canonical_request({**kw, "model": "openai/m"}, mode)) for kw in sent]


def _same(bodies: list[dict[str, Any]], model: type[BaseModel], mode: str, retries: int = 2) -> Any:
    messages = _messages()
    ours = asyncio.run(_lunasol_run(bodies, model, mode, messages, retries))
    # replay (shaping) against instructor live, through litellm and through the openai SDK alike
    for openai_sdk in (False, True):
        theirs = asyncio.run(_instructor_run(bodies, model, mode, messages, retries, openai_sdk))
        assert ours[0] == theirs[0]  # every request, byte for byte as JSON (re-asks included)
        assert _keys(ours[0], mode) == _keys(theirs[0], mode)
        assert ours[1] == theirs[1]
        shown = [None if e is None else describe(e) for e in (ours[2], theirs[2])]
        assert shown[0] == shown[1], openai_sdk
    return ours


def _body(mode: str, args: Any, *, finish: str = "stop", content: str | None = None) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args)
    if mode == "tools":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "X", "arguments": args}}],
        }
    elif mode == "md_json":
        message = {"role": "assistant", "content": f"Here it is:\n```json\n{text}\n```"}
    else:
        message = {"role": "assistant", "content": text}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _demo_answers() -> list[tuple[type[BaseModel], dict[str, Any]]]:
    by_name = {m.__name__: m for m in ROLE_MODELS}
    out = []
    for path in sorted(p for demo in DEMOS for p in demo.glob("*/*.json")):
        record = json.loads(path.read_bytes())
        call = record["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
        out.append((by_name[call["name"]], json.loads(call["arguments"])))
    return out


# -- first requests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", shaping.MODES)
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_first_request_is_instructors(model: type[BaseModel], mode: str) -> None:
    from pipeline.models.estimate import instructor_request

    class _Stop(Exception):
        pass

    captured: list[dict[str, Any]] = []

    async def complete(**kwargs: Any) -> Any:
        captured.append(json.loads(json.dumps(kwargs)))
        raise _Stop

    import instructor

    client: Any = instructor.from_litellm(complete, mode=getattr(instructor.Mode, INSTRUCTOR_MODES[mode]))
    with pytest.raises(Exception):  # noqa: B017 - instructor wraps our stop in its own exception
        asyncio.run(client.chat.completions.create(response_model=model, messages=_messages(), max_retries=0, **PARAMS))
    ours = json.loads(json.dumps(shaping.shape_request(_messages(), model, mode, **PARAMS)))
    assert ours == captured[0]
    assert instructor_request(_messages(), model, mode) == shaping.shape_request(_messages(), model, mode)


@pytest.mark.parametrize("mode", shaping.MODES)
def test_a_shaped_request_never_changes_the_next_one(mode: str) -> None:
    # the schema is made once per model class: what one request's caller does to it stays in that request
    first = shaping.shape_request(_messages(), LunaAnswer, mode)
    expected = json.loads(json.dumps(first))
    for m in first["messages"]:
        m["content"] = "changed"
    if "tools" in first:
        first["tools"][0]["function"]["parameters"]["properties"].clear()
    if "json_schema" in first.get("response_format", {}):
        first["response_format"]["json_schema"]["schema"]["properties"].clear()
    assert shaping.shape_request(_messages(), LunaAnswer, mode) == expected


def test_the_demo_recordings_keys_are_rebuilt() -> None:
    """Every demo recording's (H0 and H5, the judge's too) request is what shape_request builds (keys unchanged)."""
    by_name = {m.__name__: m for m in ROLE_MODELS}
    records = [json.loads(p.read_bytes()) for demo in DEMOS for p in sorted(demo.glob("*/*.json"))]
    assert records, "demo recordings absent"
    for record in records:
        request = dict(record["request"])
        mode = request.pop("instructor_mode")
        model = by_name[request["tools"][0]["function"]["name"]]
        system, user = request["messages"]
        params = {k: request[k] for k in ("temperature", "max_tokens") if k in request}
        shaped = shaping.shape_request([system, user], model, mode, **params)
        assert request_key(canonical_request({**shaped, "model": record["model"]}, mode)) == record["key"]


# -- answers and re-asks --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", shaping.MODES)
def test_demo_answers_parse_as_instructor_parses_them(mode: str) -> None:
    for model, args in _demo_answers():
        ours = _same([_body(mode, args)], model, mode)
        assert ours[1] is not None


@pytest.mark.parametrize("mode", shaping.MODES)
def test_a_reask_after_an_invalid_answer_is_instructors(mode: str) -> None:
    model, args = _demo_answers()[0]
    broken = {k: v for k, v in args.items() if k != next(iter(args))}  # a required field missing
    sent, value, _error = _same([_body(mode, broken), _body(mode, "not json {"), _body(mode, args)], model, mode)
    assert len(sent) == 3 and value is not None


@pytest.mark.parametrize("mode", shaping.MODES)
def test_spent_reasks_report_instructors_last_error(mode: str) -> None:
    bad = [_body(mode, {"name": 3}) for _ in range(3)]
    sent, value, error = _same(bad, Documented, mode, retries=2)
    assert value is None and error is not None and len(sent) == 3


def test_tool_mode_edge_answers_match_instructor() -> None:
    ok = {"name": "a", "count": 1}
    plain = _body("json", ok)  # content, no tool call: instructor re-asks with a user message
    with_dict_args = _body("tools", ok)
    with_dict_args["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = ok
    none_args = _body("tools", ok, content="thinking")
    none_args["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = None
    extra = _body("tools", {"name": "a"})
    extra["choices"][0]["message"]["tool_calls"][0]["provider_field"] = {"x": 1}
    _same([plain, none_args, extra, with_dict_args], Documented, "tools", retries=3)
    refused = _body("tools", ok)
    refused["choices"][0]["message"]["refusal"] = "I will not"
    _same([_body("tools", {"name": 1}), refused], Documented, "tools", retries=3)
    _same([refused], Documented, "tools", retries=3)


@pytest.mark.parametrize("mode", shaping.MODES)
def test_a_truncated_answer_is_not_reasked(mode: str) -> None:
    sent, value, error = _same([_body(mode, {"name": "a"}, finish="length")], Documented, mode)
    assert value is None and type(error).__name__ == "IncompleteOutputException" and len(sent) == 1
