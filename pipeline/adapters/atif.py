"""ATIF (Agent Trajectory Interchange Format, Harbor) trajectory JSON, v1.2 to v1.7.

``{schema_version: "ATIF-v1.x", session_id, agent{name, version, model_name}, steps: [{step_id
(1-based), timestamp?, source (system/user/agent), message, reasoning_content?, tool_calls:
[{tool_call_id, function_name, arguments}], observation: {results: [{source_call_id, content}]},
is_copied_context?}], final_metrics, continued_trajectory_ref?}``.

A file and the files its ``continued_trajectory_ref`` chain names are one cell (one session per
file); steps keep their own ``step_id`` (base 1). Copied-context steps of a continuation are kept
and marked ``detail = copied_context``. Verifier results of a Harbor trial folder, and
``final_metrics``, go to the sidecar.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.adapters.base import (
    Adapter,
    CellSource,
    Discovery,
    Emitter,
    Score,
    args_digest,
    as_text,
    first_docs,
    joined_harnesses,
    json_text,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.harbor import trial_dir, trial_files, trial_outcome

NAME = "atif"


def sniff(rel: str, head: str) -> bool:
    """JSON whose schema_version says ATIF."""
    return rel.endswith(".json") and '"ATIF-v' in head


def score(rel: str, head: str) -> Score:
    """ATIF's ``schema_version`` marker."""
    return (0.95, 'schema_version "ATIF-v..."') if sniff(rel, head) else (0.0, "")


def _is_atif(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and str(doc.get("schema_version", "")).startswith("ATIF")
        and isinstance(doc.get("steps"), list)
    )


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per ATIF chain (a trajectory plus its continuations)."""
    docs: dict[str, dict[str, Any]] = {}
    skipped: list[tuple[str, str]] = []
    for rel, doc in first_docs(bundle, paths, skipped, max_depth=1):
        if _is_atif(doc):
            docs[rel] = doc
        else:
            skipped.append((rel, "not an ATIF trajectory"))
    continuation: dict[str, str] = {}
    for rel, doc in docs.items():
        ref = doc.get("continued_trajectory_ref")
        if isinstance(ref, str):
            parent = PurePosixPath(rel).parent
            # Harbor names continuations "trajectory.cont-1.json"; files copied with a prefix keep it.
            stem = PurePosixPath(rel).name.removesuffix("trajectory.json")
            for cand in (str(parent / ref), str(parent / f"{stem}{ref}")):
                if cand in docs:
                    continuation[rel] = cand
                    break
    targets = set(continuation.values())
    cells: list[CellSource] = []
    aux: list[str] = []
    for rel, doc in docs.items():
        if rel in targets:
            continue
        chain = [rel]
        while chain[-1] in continuation and continuation[chain[-1]] not in chain:
            chain.append(continuation[chain[-1]])
        agent = doc.get("agent") or {}
        harness = str(agent.get("name") or "ATIF agent")
        trial = trial_dir(bundle, rel)
        out, texts, task = trial_outcome(bundle, trial)
        aux.extend(trial_files(bundle, trial))
        fm = doc.get("final_metrics") or {}
        if out.get("cost") is None and isinstance(fm.get("total_cost_usd"), int | float):
            out["cost"] = float(fm["total_cost_usd"])
        out["final_metrics"] = [docs[r].get("final_metrics") for r in chain]
        run = trial.name if trial else rel.removeprefix("raw/").removesuffix(".json")
        cells.append(
            CellSource(
                run_id=run,
                task_id=task or (run.split("__")[0] if trial else PurePosixPath(rel).name.split(".")[0]),
                path=rel,
                selector={"chain": chain},
                files=chain,
                harness=harness,
                step_index_base=1,
                source_steps=sum(len(docs[r]["steps"]) for r in chain),
                outcome=out,
                label_texts=texts,
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness=joined_harnesses(cells), aux=aux)


def read_steps(
    em: Emitter, steps: list[Any], session: str | None, *, base_ptr: str = "/steps"
) -> Iterator[SourceEvent]:
    """Events of ATIF steps (also used for Harbor's ATIF copies of Claude Code runs)."""
    for i, st in enumerate(steps):
        ptr = f"{base_ptr}/{i}"
        step = int(st["step_id"]) if str(st.get("step_id", "")).isdigit() else i + 1
        actor = str(st.get("source") or "")
        copied = bool(st.get("is_copied_context"))
        common: dict[str, Any] = {"ts": st.get("timestamp"), "step_index": step, "session_id": session}
        detail = "copied_context" if copied else None
        text = as_text(st.get("message"))
        reasoning = as_text(st.get("reasoning_content"))
        calls = st.get("tool_calls") or []
        if text or reasoning or not calls:
            body = text if not reasoning else f"{reasoning}\n\n{text}" if text else reasoning
            key = "message" if "message" in st else ("reasoning_content" if "reasoning_content" in st else "")
            yield em.event("message", f"{ptr}/{key}" if key else ptr, actor=actor, detail=detail, text=body, **common)
        for j, call in enumerate(calls):
            args = call.get("arguments")
            name = call.get("function_name")
            yield em.event(
                "tool_call",
                f"{ptr}/tool_calls/{j}",
                actor=actor,
                detail=detail,
                tool_name=name,
                call_id=call.get("tool_call_id"),
                args_digest=args_digest(args),
                text=f"{name} {json_text(args)}",
                **common,
            )
        names = {c.get("tool_call_id"): c.get("function_name") for c in calls}
        obs = st.get("observation") or {}
        for k, res in enumerate(obs.get("results") or [] if isinstance(obs, dict) else []):
            cid = res.get("source_call_id")
            yield tool_result_event(
                em,
                f"{ptr}/observation/results/{k}",
                as_text(res.get("content")),
                is_error=None,
                actor="environment",
                tool_name=names.get(cid),
                call_id=cid,
                detail=detail,
                **common,
            )


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one chain, file by file."""
    for k, rel in enumerate((cell.get("selector") or {}).get("chain") or [cell["path"]]):
        em = Emitter(bundle, rel, max_depth=6)
        doc = em.doc()
        session = str(doc.get("session_id") or rel)
        # Continuations may repeat the session id (and restart step ids): each file is its own session.
        yield from read_steps(em, doc["steps"], session if k == 0 else f"{session}/cont-{k}")


ADAPTER = Adapter(
    name=NAME,
    description="ATIF trajectories (Harbor's interchange format; continuation chains as one cell)",
    sniff=sniff,
    score=score,
    detects="*.json whose schema_version is ATIF-v1.x",
    discover=discover,
    read=read,
)
