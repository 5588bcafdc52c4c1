"""lunasol followup: the statistics against known values, the verdict rules, and two real generations.

The generations are real frozen bundles analysed through the real pipeline (export, probes, Luna,
Coordinator, Sol) against the local test server; the parent goes through gate 1, the proposer and
gate 2 before it is followed up. Model answers are scripted fixtures (tests/followup/followup_helpers.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.canonical import pretty_json, read_json, sha256_file
from pipeline.core.errors import BadInput
from pipeline.followup import followup, read_followup, two_means, two_proportions, z_from_rates
from pipeline.followup.conditions import predicted_direction
from pipeline.followup.schema import ConditionResult, Families, MetricResult, TargetedChange
from pipeline.followup.stats import _power, min_detectable_difference, z_pooled
from pipeline.followup.verdict import decide
from pipeline.testing.openai_server import FakeOpenAI
from tests.followup.followup_helpers import Script, analyse, through_both_gates, write_generation

FAMILIES = [f"fam{i}" for i in range(8)]
RUNS = 12  # 8 families x 12 runs = 96 cells per generation (4x the demo)


# ------------------------------------------------------------------------------------ statistics


def test_z_matches_seed_002_section_3_4() -> None:
    # seed 002 §3.4: 75.2 -> 78.9 on 369 tasks is z = 1.19; 27.0 -> 46.9 is z = 5.6.
    # (the seed rounds the denominator to 0.0310 first: 3.7 / 3.10 = 1.19; unrounded it is 1.195)
    assert abs(z_from_rates(0.752, 0.789, 369) - 1.19) < 0.01
    assert round(z_from_rates(0.270, 0.469, 369), 1) == 5.6
    # The count form used on cells gives the same ruler (100/369 = 27.1%, 173/369 = 46.9%).
    z = z_pooled(100, 369, 173, 369)
    assert z is not None and round(z, 1) == 5.6
    small = two_proportions(277, 369, 291, 369, "up")
    assert not small.significant and small.p_z is not None and 0.2 < small.p_z < 0.26


def test_fisher_matches_known_values() -> None:
    # Fisher's tea-tasting table (two-sided p = 0.4857) and the 2x2 example of Fisher's exact test
    # on Wikipedia ([[1, 9], [11, 3]], two-sided p = 0.002759).
    tea = two_proportions(3, 4, 1, 4)
    assert tea.p_fisher is not None and abs(tea.p_fisher - 0.4857) < 1e-4
    wiki = two_proportions(1, 10, 11, 14)
    assert wiki.p_fisher is not None and abs(wiki.p_fisher - 0.002759) < 1e-6 and wiki.significant


def test_swapping_the_generations_flips_the_direction() -> None:
    ab, ba = two_proportions(48, 96, 6, 96), two_proportions(6, 96, 48, 96)
    assert ab.difference is not None and ba.difference is not None and ab.z is not None and ba.z is not None
    assert ab.difference == -ba.difference < 0 and ab.z == -ba.z
    assert ab.p_fisher == ba.p_fisher and ab.ci95 is not None and ba.ci95 is not None
    assert ab.ci95 == (-ba.ci95[1], -ba.ci95[0])


def test_minimum_detectable_difference_is_the_80_percent_power_point() -> None:
    # 24 vs 24 cells at 12.5% (the demo's W-01): even the pattern's disappearance is below 80% power.
    mdd, full = min_detectable_difference(3 / 24, 24, 24, "down")
    assert mdd is None and 0.3 < full < 0.6
    # 96 vs 96 at 50%: a drop of about 20 points is detectable; the power there is 80%.
    mdd, full = min_detectable_difference(0.5, 96, 96, "down")
    assert mdd is not None and 0.15 < mdd < 0.25 and full > 0.99
    assert abs(_power(0.5, 0.5 - mdd, 96, 96) - 0.8) < 1e-3
    assert _power(0.5, 0.5 - mdd / 2, 96, 96) < 0.8


def test_welch_means_against_a_hand_computation() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0, 6.0]
    m = two_means(a, b)
    # mean diff 1.5; var a 1.6667, var b 2.5; se = sqrt(1.6667/4 + 2.5/5) = 0.9574; t = 1.5667
    assert m.difference == 1.5 and m.t is not None and abs(m.t - 1.5667) < 1e-3
    assert m.p is not None and 0.15 < m.p < 0.17 and not m.significant


@pytest.mark.parametrize(
    ("text", "direction"),
    [
        ("Completion should improve where the owner repairs the artifact.", "up"),
        ("Re-checks and report rewrites should become rarer.", "down"),
        ("May improve where the owner can repair the artifact.", None),
        ("No judge gain is presumed.", None),
        ("No saving is predicted in tokens.", None),
        ("The same blocker should lead to the same route.", None),
        ("完成率应提高。", "up"),
    ],
)
def test_card_text_counts_as_a_prediction_only_without_hedging(text: str, direction: str | None) -> None:
    assert predicted_direction(text) == direction


def _targeted(a: int, an: int, b: int, bn: int) -> TargetedChange:
    return TargetedChange(predicted="down", groups=[], overall=two_proportions(a, an, b, bn, "down"), per_family=[],
                          parent_cells=[], child_cells=[], not_analysed={"parent": [], "child": []})  # fmt: skip


def _metric(outcome: str, required: bool) -> MetricResult:
    return MetricResult(metric="completion", better="up", card_expectation="x", predicted="up" if required else None,
                        required=required, outcome=outcome)  # type: ignore[arg-type]  # fmt: skip


FAMS = Families(covered=["a", "b"], parent_only=["c"], child_only=[])


def test_verdict_rules() -> None:
    ok = [ConditionResult(index=1, condition="c", check=None, status="undetermined", reason="r")]
    v = decide(_targeted(48, 96, 0, 96), [_metric("improved", True)], ok, FAMS)
    assert v.verdict == "supported" and v.covers == ["a", "b"] and v.does_not_cover == ["c"] and v.pending_human == [1]
    # a metric the card predicted to improve must improve
    assert decide(_targeted(48, 96, 0, 96), [_metric("no significant change", True)], [], FAMS).verdict == (
        "inconclusive"
    )
    assert decide(_targeted(48, 96, 0, 96), [_metric("worsened", True)], [], FAMS).verdict == "rejected"
    # a metric the card did not predict is reported, never required
    assert decide(_targeted(48, 96, 0, 96), [_metric("worsened", False)], [], FAMS).verdict == "supported"
    # against the prediction
    assert decide(_targeted(10, 96, 40, 96), [], [], FAMS).verdict == "rejected"
    # underpowered: never support, even with the pattern gone
    v = decide(_targeted(3, 24, 0, 24), [], [], FAMS)
    assert v.verdict == "inconclusive" and "underpowered" in v.reason
    # powered, no significant change, the pattern clearly still there
    assert decide(_targeted(48, 96, 45, 96), [], [], FAMS).verdict == "rejected"
    trig = [ConditionResult(index=2, condition="c", check="x", status="triggered", reason="seen in C001")]
    assert decide(_targeted(48, 96, 0, 96), [], trig, FAMS).verdict == "rejected"


# ------------------------------------------------------------------------------ two generations


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, _fake_llm_server: FakeOpenAI) -> dict[str, Any]:
    """A parent (W-01 shape in half of the cells) through both gates, and three children of it."""
    from pipeline.core.settings import ModelSettings

    root = tmp_path_factory.mktemp("followup")
    runs = root / "runs"
    server = _fake_llm_server
    server.reset()
    script = Script(runs)
    server.handler = script
    settings = ModelSettings(
        model="openai/test-model", api_base=server.base_url, timeout_s=5.0, max_reasks=2, instructor_mode="tools"
    )

    def cells(planted: Any, runs_: int = RUNS, fams: list[str] = FAMILIES) -> set[str]:
        out, n = set(), 0
        for fi in range(len(fams)):
            for r in range(1, runs_ + 1):
                n += 1
                if planted(fi, r):
                    out.add(f"C{n:03d}")
        return out

    def parent_planted(f: int, r: int) -> bool:
        return r <= 6

    pb = write_generation(root / "b-parent", run_id="parent", families=FAMILIES, runs=RUNS, planted=parent_planted)
    parent = analyse(pb, runs, "parent", script, settings, cells(parent_planted))
    through_both_gates(parent, settings)
    impl = {"parent_harness": "H0", "proposal_id": "P-01", "parent_run_id": "parent"}
    out: dict[str, Any] = {"parent": parent, "runs": runs, "root": root, "settings": settings, "script": script,
                           "server": server}  # fmt: skip
    children = {
        "child-gone": (lambda f, r: False, FAMILIES, RUNS),  # the shape is gone everywhere
        "child-one-left": (lambda f, r: f == 2 and r == 1, FAMILIES, RUNS),  # gone but in one cell
        "child-tiny": (lambda f, r: False, FAMILIES[:3], 1),  # 3 cells
    }
    for name, (planted, fams, n) in children.items():
        b = write_generation(root / f"b-{name}", run_id=name, families=fams, runs=n, planted=planted, harness="H1",
                             generation=1, implements=impl)  # fmt: skip
        out[name] = analyse(b, runs, name, script, settings, cells(planted, n, fams))
    server.reset()
    return out


def _fu(world: dict[str, Any], child: str, **kw: Any) -> Any:
    """followup on one of the world's children, its judge answered by the scripted model."""
    world["server"].handler = world["script"]
    return followup(world["parent"], "P-01", world[child], settings=world["settings"], **kw)


def test_the_shape_gone_is_supported(world: dict[str, Any]) -> None:
    res = _fu(world, "child-gone")
    doc = res.doc
    assert res.path == world["child-gone"] / "followup.json"
    t = doc.targeted.overall
    assert (t.a_hits, t.a_n, t.b_hits, t.b_n) == (48, 96, 0, 96)
    assert doc.verdict.verdict == "supported", doc.verdict.reason
    assert t.significant and t.powered and t.mdd is not None and t.mdd < 0.5
    assert [r.task_id for r in doc.targeted.per_family] == FAMILIES
    assert doc.verdict.covers == FAMILIES and doc.verdict.does_not_cover == []
    by = {c.index: c for c in doc.conditions}
    assert by[1].check == "unchanged_recheck" and by[1].status == "not_triggered"
    # no count speaks to condition 2: the judge's answer decides it, with a child ref
    assert by[2].check is None and by[2].decided_by == "judge" and by[2].status == "not_triggered" and by[2].refs
    assert by[3].check == "metric_regression" and by[3].status == "not_triggered" and by[3].decided_by == "count"
    assert doc.verdict.pending_human == [] and doc.conflicts == []
    assert doc.judge is not None and doc.judge.ok and doc.judge.behavioral_change is not None
    completion = next(m for m in doc.metrics if m.metric == "completion")
    assert completion.required and completion.outcome == "improved"
    cost = next(m for m in doc.metrics if m.metric == "cost")
    assert not cost.required  # "No saving is presumed."


def test_followup_json_is_bound_by_digest_and_canonical(world: dict[str, Any]) -> None:
    parent, child = world["parent"], world["child-gone"]
    res = _fu(world, "child-gone")
    raw = (child / "followup.json").read_text(encoding="utf-8")
    assert raw == pretty_json(json.loads(raw))
    doc = read_followup(child)
    assert doc is not None and doc.digest == doc.content_digest() == res.doc.digest
    handoff = read_json(parent / "handoff.json")
    receipt = parent / handoff["receipts"]["gate2"]
    assert doc.parent.gate2_receipt_digest == read_json(receipt)["receipt_digest"]
    assert doc.parent.proposals_digest == sha256_file(parent / "proposals.yaml")
    assert doc.parent.shortlist_digest == read_json(parent / "weakness-shortlist.json")["digest"]
    assert doc.child.shortlist_digest == read_json(child / "weakness-shortlist.json")["digest"]
    assert doc.parent.bundle_digest == read_json(parent / "run.json")["bundle_digest"]
    assert doc.child.bundle_digest == read_json(child / "run.json")["bundle_digest"] != doc.parent.bundle_digest
    assert doc.child.harness == "H1" and doc.child.implements_proposal == "P-01"
    # rerun: byte-identical
    _fu(world, "child-gone")
    assert (child / "followup.json").read_text(encoding="utf-8") == raw


def test_one_cell_left_is_rejected_with_child_refs_that_resolve(world: dict[str, Any]) -> None:
    child = world["child-one-left"]
    doc = _fu(world, "child-one-left").doc
    assert doc.targeted.overall.b_hits == 1 and doc.targeted.overall.significant  # the drop itself is clear
    assert doc.verdict.verdict == "rejected" and "condition 1" in doc.verdict.reason
    c1 = doc.conditions[0]
    assert c1.status == "triggered" and c1.cells == ["C025"] and c1.refs
    for ref in c1.refs:  # what `lunasol show-ref REF --run CHILD` prints: the raw lines, hash-checked
        res = CliRunner().invoke(app, ["show-ref", ref, "--run", str(child)])
        assert res.exit_code == 0 and res.output.strip(), res.output
    assert any("controller.jsonl" in r for r in c1.refs)
    # the judge said "not triggered" on the same condition: the count overrides it, the conflict recorded
    assert c1.decided_by == "count" and c1.judge is not None and c1.judge.status == "not_triggered"
    assert [(k.index, k.count_status, k.judge_status) for k in doc.conflicts] == [(1, "triggered", "not_triggered")]
    saved = read_followup(child)
    assert saved is not None and saved.conflicts == doc.conflicts


def test_three_cells_are_inconclusive_with_the_power_figure(world: dict[str, Any]) -> None:
    doc = _fu(world, "child-tiny", ask_judge=False).doc
    t = doc.targeted.overall
    assert (t.a_n, t.b_n, t.b_hits) == (36, 3, 0)  # restricted to the 3 families in both
    assert doc.verdict.verdict == "inconclusive" and "underpowered" in doc.verdict.reason
    assert t.mdd is None and t.power_at_full_change is not None and t.power_at_full_change < 0.8
    assert doc.verdict.covers == FAMILIES[:3] and doc.verdict.does_not_cover == FAMILIES[3:]
    # --no-judge: what no count settles is left to a human
    assert doc.judge is not None and not doc.judge.asked and doc.verdict.pending_human == [2]
    assert doc.conditions[1].decided_by == "human" and doc.conditions[1].judge is None


def test_cli_text_and_json(world: dict[str, Any]) -> None:
    runner = CliRunner()
    args = ["followup", str(world["parent"]), "--proposal", "P-01", "--child", str(world["child-gone"]), "--no-judge"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "verdict: SUPPORTED" in res.output and "overall" in res.output and "fam7" in res.output
    assert "minimum detectable difference" in res.output
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["verdict"]["verdict"] == "supported"


def _one_line_exit_2(args: list[str]) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output
    return lines[0]


def test_refusals_are_one_line_and_write_nothing(world: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    parent, child = world["parent"], world["child-tiny"]
    (child / "followup.json").unlink(missing_ok=True)
    line = _one_line_exit_2(["followup", str(parent), "--proposal", "P-09", "--child", str(child)])
    assert "P-09 was not selected" in line and "P-01" in line
    # the child as a parent: it has no selection
    line = _one_line_exit_2(["followup", str(child), "--proposal", "P-01", "--child", str(world["child-gone"])])
    assert "no gate-2 selection" in line
    # a child whose request implements another proposal
    other = tmp_path / "b-other"
    impl = {"parent_harness": "H0", "proposal_id": "P-02"}
    write_generation(other, run_id="child-other", families=FAMILIES[:1], runs=1, planted=lambda f, r: False,
                     harness="H1", generation=1, implements=impl)  # fmt: skip
    runs = world["runs"]
    from pipeline.ir.export import export

    export(other, runs / "child-other")
    shutil.copy(child / "pattern-groups.json", runs / "child-other" / "pattern-groups.json")
    shutil.copy(child / "weakness-shortlist.json", runs / "child-other" / "weakness-shortlist.json")
    line = _one_line_exit_2(["followup", str(parent), "--proposal", "P-01", "--child", str(runs / "child-other")])
    assert "implements P-02, not P-01" in line
    # a child made without a model (export only): the judge cannot be asked, and the line says how to go on
    bare = tmp_path / "b-bare"
    write_generation(bare, run_id="child-bare", families=FAMILIES[:1], runs=1, planted=lambda f, r: False,
                     harness="H1", generation=1, implements={**impl, "proposal_id": "P-01"})  # fmt: skip
    export(bare, runs / "child-bare")
    for name in ("pattern-groups.json", "weakness-shortlist.json"):
        shutil.copy(child / name, runs / "child-bare" / name)
    line = _one_line_exit_2(["followup", str(parent), "--proposal", "P-01", "--child", str(runs / "child-bare")])
    assert "the judge needs a model" in line and "--no-judge" in line and "--model" in line
    # the parent's own bundle as a child
    with pytest.raises(BadInput, match="same bundle"):
        followup(parent, "P-01", parent)
    assert not (child / "followup.json").exists() and not (runs / "child-other" / "followup.json").exists()
    assert not (runs / "child-bare" / "followup.json").exists()
    assert not (parent / "followup.json").exists()


def test_a_child_without_lineage_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    b = write_generation(tmp_path / "b", run_id="plain", families=FAMILIES[:1], runs=1, planted=lambda f, r: False,
                         harness="H1", generation=1)  # fmt: skip
    from pipeline.ir.export import export

    run = tmp_path / "runs" / "plain"
    export(b, run)
    for name in ("pattern-groups.json", "weakness-shortlist.json"):
        (run / name).write_bytes((world["child-tiny"] / name).read_bytes())
    with pytest.raises(BadInput, match="does not say what it implements"):
        followup(world["parent"], "P-01", run)


def test_the_child_report_has_a_followup_section_with_its_refs_embedded(world: dict[str, Any]) -> None:
    from pipeline.report.build import render_report

    child = world["child-one-left"]
    doc = _fu(world, "child-one-left").doc
    html, stats = render_report(child)
    assert 'id="followup"' in html and 'id="followup-verdict">rejected<' in html
    assert stats["unresolved"] == 0 and stats["hash_mismatches"] == 0
    for ref in doc.conditions[0].refs:
        assert ref in html
    # a run without followup.json has no such section
    html, _ = render_report(world["parent"])
    assert 'id="followup"' not in html


def test_an_invented_ref_is_re_asked_then_undetermined(world: dict[str, Any]) -> None:
    """The judge cites an event the child does not have: the check sends it back; still invented, undetermined."""
    from pipeline.testing.openai_server import Reply, completion_body

    script, server = world["script"], world["server"]
    judge_requests: list[dict[str, Any]] = []

    def inventing(request: dict[str, Any]) -> Reply:
        data = script.judge("\n".join(m.get("content") or "" for m in request["messages"]))
        data["conditions"][1]["refs"] = ["C001-e9999"]  # no such event in the child
        judge_requests.append(request)
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    server.handler = inventing
    # the judge's earlier answer to the same request is held in the run's exchanges and would be served
    # (an answer is never bought twice): this test needs the server's new, inventing one
    shutil.rmtree(world["child-gone"] / "exchanges", ignore_errors=True)
    doc = followup(world["parent"], "P-01", world["child-gone"], settings=world["settings"]).doc
    reasks = world["settings"].max_reasks
    assert len(judge_requests) == reasks + 1  # the first ask and every re-ask
    assert "C001-e9999" in judge_requests[-1]["messages"][-1]["content"]  # the re-ask names the invented ref
    assert doc.judge is not None and doc.judge.ok is False and doc.judge.attempts == reasks + 1
    c2 = doc.conditions[1]
    assert c2.status == "undetermined" and c2.decided_by == "human" and c2.refs == []
    assert c2.judge is not None and c2.judge.status == "undetermined"
    assert any("C001-e9999" in p for p in c2.judge.problems)
    assert doc.verdict.pending_human == [2]
    # the answers whose refs resolve are kept, and every kept ref resolves in the child run
    b = doc.judge.behavioral_change
    assert b is not None and b.status == "observed" and b.refs
    for ref in b.refs:
        res = CliRunner().invoke(app, ["show-ref", ref, "--run", str(world["child-gone"])])
        assert res.exit_code == 0 and res.output.strip(), res.output
    calls = [json.loads(x) for x in (world["child-gone"] / "calls.jsonl").read_text().splitlines()]
    assert calls[-1]["role"] == "judge" and calls[-1]["outcome"] == "check_failed"


@pytest.mark.slow
def test_a_judge_killed_between_answer_and_artifact_is_not_paid_again(world: dict[str, Any]) -> None:
    """A real SIGKILL after the judge's ok row reached calls.jsonl, before followup's artifact: 0 re-paid."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.run.test_kill_never_pays_twice import _KILLER, ROOT, _held, _repaid

    server, child, s = world["server"], world["child-one-left"], world["settings"]
    server.handler = world["script"]
    shutil.rmtree(child / "exchanges", ignore_errors=True)  # whatever an earlier test held: asked afresh
    body = textwrap.dedent(
        f"""
        from pathlib import Path
        from pipeline.core.settings import ModelSettings
        from pipeline.followup import followup
        settings = ModelSettings.model_validate_json({s.model_dump_json()!r})
        followup(Path({str(world["parent"])!r}), "P-01", Path({str(child)!r}), settings=settings)
        """
    )
    script = _KILLER.format(root=str(ROOT), role="judge", point="logged") + body
    before = len(server.requests)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))  # fmt: skip
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])
    killed_at, held = len(server.requests), _held(child)
    assert killed_at > before and held  # the judge was really asked, and its answer kept
    doc = followup(world["parent"], "P-01", child, settings=s).doc
    assert doc.judge is not None and doc.judge.ok
    assert _repaid(server.requests, killed_at, held) == 0
