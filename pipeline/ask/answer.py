"""What an ask is (question, answer kind, cell filter) and the answer model and checks of one call."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from pipeline.artifacts.rundir import RunDir
from pipeline.core.canonical import digest, read_json
from pipeline.core.errors import BadInput

AnswerKind = Literal["yes-no", "choice", "number"]
EXPLANATION_CHARS = 600
MAX_CHOICES = 20


WEAKNESS_CHOICES = ("supports", "contradicts", "neither")


@dataclass(frozen=True)
class AskSpec:
    """One question asked of every selected cell (or of a seeded sample of them)."""

    question: str
    kind: AnswerKind
    choices: tuple[str, ...] = ()
    where: str | None = None
    sample: int | None = None  # ask only this many of the selected cells, drawn with ``seed``
    seed: int = 0
    weakness: str | None = None  # the card the question was made from

    @property
    def ask_id(self) -> str:
        """A stable id: the same question, answer kind, filter and sample is the same ask (its rows are replaced)."""
        key: dict[str, object] = {"q": self.question, "k": self.kind, "c": list(self.choices), "w": self.where}
        if self.sample is not None:
            key["s"] = [self.sample, self.seed]
        return "ask-" + digest(key).removeprefix("sha256:")[:10]

    @property
    def values(self) -> tuple[str, ...]:
        """The possible answers of a yes-no or choice question (empty for a number)."""
        return ("yes", "no") if self.kind == "yes-no" else self.choices


def parse_answer_kind(value: str) -> tuple[AnswerKind, tuple[str, ...]]:
    """``yes-no``, ``number``, or CHOICES as ``a|b|c`` (or ``a,b,c``): at least two distinct choices."""
    v = value.strip()
    if v.lower() in ("yes-no", "yesno", "yes/no"):
        return "yes-no", ()
    if v.lower() == "number":
        return "number", ()
    sep = "|" if "|" in v else ","
    choices = tuple(c.strip() for c in v.split(sep) if c.strip())
    if len(choices) < 2 or len(set(choices)) != len(choices) or len(choices) > MAX_CHOICES:
        raise BadInput(
            f"--answer {value!r}: use yes-no, number, or 2 to {MAX_CHOICES} distinct choices separated by '|'"
        )
    return "choice", choices


@functools.lru_cache(maxsize=32)
def answer_model(kind: AnswerKind, choices: tuple[str, ...] = ()) -> type[BaseModel]:
    """The pydantic model of one answer (its schema is the tool schema and the prompt's answer text)."""
    answer: Any
    if kind == "number":
        answer = (float, Field(description="the number the question asks for"))
    else:
        values = ("yes", "no") if kind == "yes-no" else choices
        answer = (Literal[values], Field(description="exactly one of: " + ", ".join(values)))
    return create_model(
        "AskAnswer",
        __config__=ConfigDict(extra="forbid"),
        answer=answer,
        explanation=(
            str,
            Field(max_length=EXPLANATION_CHARS, description="one or two sentences: what in the log decides it"),
        ),
        evidence=(
            list[str],
            Field(description="event ids shown in the log that show it (at least one, except for a 'no')"),
        ),
    )


AskAnswer = answer_model("yes-no")
"""The answer model of a yes-no ask (the role's named model; a choice or number ask builds its own)."""


def check_answer(answer: BaseModel, *, kind: AnswerKind, shown_ids: set[str]) -> list[str]:
    """Why an answer cannot be kept (empty: it can): cited ids must be in the log shown; evidence required."""
    data = answer.model_dump()
    errors: list[str] = []
    evidence = [str(e) for e in data["evidence"]]
    unknown = [e for e in evidence if e not in shown_ids]
    if unknown:
        errors.append(f"evidence cites ids not shown in this log: {', '.join(unknown[:5])}; cite only ids shown")
    if not evidence and not (kind == "yes-no" and data["answer"] == "no"):
        errors.append("evidence is empty: cite at least one event id that shows your answer")
    if not str(data["explanation"]).strip():
        errors.append("explanation is empty: say in one or two sentences what in the log decides the answer")
    return errors


def weakness_question(card: dict[str, Any]) -> str:
    """The question a weakness card makes: does this cell support or contradict its statement and prediction."""
    statement = str(card.get("statement") or "").strip()
    prediction = str(card.get("counterfactual_prediction") or "").strip()
    if not statement:
        raise BadInput(f"weakness {card.get('weakness_id')} has no statement to ask about")
    return (
        f"Weakness {card.get('weakness_id')} states: {statement}\n"
        f"Its falsifiable prediction: {prediction or '(none given)'}\n"
        "Does this cell's log support it (it shows what the statement describes), contradict it (it shows "
        "the situation the statement is about and what the prediction says would refute it), or neither "
        "(the situation does not arise in this cell)?"
    )


def find_card(run_dir: Path, weakness_id: str) -> dict[str, Any]:
    """The weakness card ``weakness_id`` of the run's shortlist; BadInput naming the cards there otherwise."""
    path = RunDir(run_dir).shortlist
    if not path.is_file():
        raise BadInput(f"no weakness shortlist in {run_dir.name} yet (Sol has not run)")
    doc = read_json(path)
    cards = [w for w in (doc.get("weaknesses") if isinstance(doc, dict) else doc) or [] if isinstance(w, dict)]
    for w in cards:
        if w.get("weakness_id") == weakness_id:
            return w
    known = ", ".join(str(w.get("weakness_id")) for w in cards) or "none"
    raise BadInput(f"no weakness {weakness_id} in {run_dir.name} (cards: {known})")
