"""Outcome files of a Harbor / Terminal-Bench trial folder (shared by the claude-code and atif adapters).

A trial folder ``<task>__<id>/`` holds ``result.json`` (``verifier_result.rewards.reward``,
``exception_info``, token counts), ``verifier/reward.txt``, ``verifier/ctrf.json`` (test report)
and ``verifier/test-stdout.txt``. All of it is outcome: it goes to the sidecar only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.adapters.base import as_dict, score_label
from pipeline.core.canonical import read_json


def trial_dir(bundle: Path, rel: str) -> Path | None:
    """The trial folder a log under ``<trial>/agent/`` belongs to, when it has a ``result.json``."""
    p = (bundle / rel).parent
    for cand in (p, p.parent):
        if (cand / "result.json").is_file() and cand != bundle:
            return cand
    return None


_OUTCOME_FILES = ("result.json", "verifier/reward.txt", "verifier/ctrf.json", "verifier/test-stdout.txt")


def trial_files(bundle: Path, trial: Path | None) -> list[str]:
    """The outcome files of a trial folder that exist (bundle-relative): read for the sidecar, kept in raw/."""
    if trial is None:
        return []
    return [(trial / f).relative_to(bundle).as_posix() for f in _OUTCOME_FILES if (trial / f).is_file()]


def _read_json(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def trial_outcome(bundle: Path, trial: Path | None) -> tuple[dict[str, Any], list[str], str | None]:
    """(outcome fields, label texts that must never reach events, task name) of one trial folder."""
    if trial is None:
        return {}, [], None
    res = _read_json(trial / "result.json")
    out: dict[str, Any] = {}
    texts: list[str] = []
    task = None
    if isinstance(res, dict):
        task = res.get("task_name")
        vr = res.get("verifier_result")
        reward = vr.get("rewards", {}).get("reward") if isinstance(vr, dict) else None
        out["verifier_reward"] = reward
        exc = res.get("exception_info")
        out["exception_type"] = exc.get("exception_type") if isinstance(exc, dict) else None
        agent = as_dict(res.get("agent_result"))
        cost = agent.get("cost_usd")
        out["cost"] = float(cost) if isinstance(cost, int | float) else None
        out["n_input_tokens"] = agent.get("n_input_tokens")
        out["n_output_tokens"] = agent.get("n_output_tokens")
    reward_txt = trial / "verifier" / "reward.txt"
    if reward_txt.is_file():
        raw = reward_txt.read_text(encoding="utf-8").strip()
        try:
            out["reward_txt"] = float(raw)
        except ValueError:
            out["reward_txt"] = raw
    ctrf = _read_json(trial / "verifier" / "ctrf.json")
    if isinstance(ctrf, dict):
        summary = (ctrf.get("results") or {}).get("summary") or {}
        out["tests"] = {k: summary.get(k) for k in ("tests", "passed", "failed", "skipped")}
        for t in (ctrf.get("results") or {}).get("tests") or []:
            msg = t.get("message") or t.get("trace")
            if isinstance(msg, str) and len(msg) > 40:
                texts.append(msg)
    stdout = trial / "verifier" / "test-stdout.txt"
    if stdout.is_file():
        out["verifier_stdout_file"] = stdout.relative_to(bundle).as_posix()
    reward = out.get("verifier_reward")
    if reward is None and isinstance(out.get("reward_txt"), float):
        reward = out["reward_txt"]  # result.json has no reward when its verifier timed out; reward.txt may
    out["quality"] = reward
    out["label"] = score_label(reward)
    return out, texts, task
