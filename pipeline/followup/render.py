"""The follow-up as text: the verdict, the prevalence table, the tests, the metrics, each condition."""

from __future__ import annotations

from pipeline.followup.schema import Followup
from pipeline.followup.stats import ProportionTest


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _row(name: str, t: ProportionTest) -> str:
    mdd = "none" if t.mdd is None else _pct(t.mdd)
    ci = "-" if t.ci95 is None else f"[{100 * t.ci95[0]:+.1f}, {100 * t.ci95[1]:+.1f}]"
    diff = "-" if t.difference is None else f"{100 * t.difference:+.1f}"
    return (
        f"{name:<32} {t.a_hits:>3}/{t.a_n:<4} {_pct(t.a_rate):>6}  {t.b_hits:>3}/{t.b_n:<4} {_pct(t.b_rate):>6}  "
        f"{diff:>6} {ci:>16}  {t.p_fisher if t.p_fisher is not None else '-':>8}  {mdd:>6}"
    )


def render_text(doc: Followup) -> str:
    """A plain-text page: verdict first, then the numbers it rests on."""
    v, t = doc.verdict, doc.targeted
    lines = [
        f"followup {doc.proposal.proposal_id} ({doc.proposal.source_weakness}) of {doc.parent.run_id} "
        f"on {doc.child.run_id} (generation {doc.child.generation})",
        f"verdict: {v.verdict.upper()} — {v.reason}",
        f"covers: {', '.join(v.covers) or 'no task family'}"
        + (f"; does not cover: {', '.join(v.does_not_cover)}" if v.does_not_cover else ""),
        "",
        f"targeted pattern (predicted {t.predicted}): {doc.proposal.targeted_pattern_change.strip()}",
        f"{'task family':<32} {'parent':^15}  {'child':^15}  {'diff':>6} {'95% CI (points)':>16}  "
        f"{'Fisher p':>8}  {'MDD':>6}",
    ]
    lines += [_row(r.task_id, r.test) for r in t.per_family]
    lines.append(_row("overall", t.overall))
    o = t.overall
    lines.append(
        f"z = {o.z} (p = {o.p_z}); power to see the pattern disappear: {_pct(o.power_at_full_change)}; "
        f"minimum detectable difference at 80% power: {'none reachable' if o.mdd is None else _pct(o.mdd)}"
    )
    lines.append("groups: " + "; ".join(
        f"{g.parent_group} {g.type} {g.concerns} -> {g.child_group or 'no match'}" for g in t.groups
    ))  # fmt: skip
    lines += ["", "outcome metrics (sidecars; required only when the card predicts an improvement):"]
    for m in doc.metrics:
        if m.proportion is not None:
            p = m.proportion
            fig = f"{_pct(p.a_rate)} -> {_pct(p.b_rate)}, Fisher p={p.p_fisher}"
        elif m.mean is not None:
            fig = f"{m.mean.a_mean} -> {m.mean.b_mean}, Welch p={m.mean.p}"
        else:
            fig = "no data"
        need = "required" if m.required else "reported"
        lines.append(f"  {m.metric:<11} {m.outcome:<22} {fig}  [{need}; card predicts {m.predicted or 'no direction'}]")
    j = doc.judge
    lines += [""]
    if j is None:
        lines.append("judge: not part of this file (written before the judged part existed)")
    elif not j.asked:
        lines.append(f"judge: {j.note}")
    else:
        state = "ok" if j.ok else f"answer not accepted after {j.attempts} attempt(s): {'; '.join(j.errors)}"
        lines.append(f"judge ({j.model or 'model'}): {state}; {j.note}")
        b = j.behavioral_change
        if b is not None:
            lines.append(f"  behavioural change: [{b.status}] {b.reason}")
            lines += [f"     {problem}" for problem in b.problems]
            lines += [f"     {ref}" for ref in b.refs]
    lines += ["", "rejection conditions (decided by a count, else by the judge, else left to a human):"]
    for c in doc.conditions:
        how = {"count": f"count: {c.check}", "judge": "judge", "human": "for a human"}[c.decided_by]
        lines.append(f"  {c.index}. [{c.status}] ({how}) {c.condition}")
        lines.append(f"     {c.reason}")
        lines += [f"     {ref}" for ref in c.refs]
        if c.judge is not None and c.decided_by != "judge":
            lines.append(f"     judge said [{c.judge.status}]: {c.judge.reason}")
            lines += [f"       {problem}" for problem in c.judge.problems]
    for k in doc.conflicts:
        lines.append(f"conflict on condition {k.index}: count {k.count_status}, judge {k.judge_status}; {k.resolution}")
    return "\n".join(lines) + "\n"
