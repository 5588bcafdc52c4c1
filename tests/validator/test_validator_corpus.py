"""The hand-written corpus: every invalid card fires exactly its rule; every valid card passes.

File names carry the expectation: ``tests/cards/invalid/<RULE-ID>__<lang>_<slug>.yaml``.
The seed's example cards P-01 and P-02 are extracted from seed 000 at test time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artifacts.proposals_file import parse_entries
from pipeline.validator import RULES, validate_entries, validate_file
from tests.cards.fixture_run import make_run
from tests.cards.seed import SEED, seed_yaml_blocks

CARDS = Path(__file__).resolve().parents[1] / "cards"
INVALID = sorted((CARDS / "invalid").glob("*.yaml"))
INVALID_RUN = sorted((CARDS / "invalid" / "run").glob("*.yaml"))
VALID = sorted((CARDS / "valid").glob("*.yaml"))


def _expected(path: Path) -> str:
    rule = path.name.split("__")[0]
    assert rule in RULES, f"{path.name}: unknown rule id {rule}"
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert header == f"# expect: {rule}", f"{path.name}: header and file name disagree"
    return rule


def test_corpus_size_and_languages() -> None:
    files = INVALID + INVALID_RUN
    assert len(files) >= 40
    zh = [p for p in files if "__zh_" in p.name]
    en = [p for p in files if "__en_" in p.name]
    assert len(zh) + len(en) == len(files)
    assert min(len(zh), len(en)) >= len(files) // 3  # about half each
    n_valid_cards = sum(len(validate_file(p).cards) for p in VALID)
    assert n_valid_cards >= 8
    assert any("zh_" in p.name for p in VALID) and any("en_" in p.name for p in VALID)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_card_fires_exactly_its_rule(path: Path) -> None:
    rule = _expected(path)
    result = validate_file(path)
    assert not result.valid
    fired = {f.rule for f in result.findings}
    assert fired == {rule}, [f.line() for f in result.findings]
    assert all(f.path.startswith("proposals[") for f in result.findings)


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize("path", INVALID_RUN, ids=lambda p: p.name)
def test_invalid_card_against_run_fires_exactly_its_rule(path: Path, corpus_run: Path) -> None:
    rule = _expected(path)
    assert validate_file(path).valid, "a run-rule card must be valid without the run"
    fired = {f.rule for f in validate_file(path, corpus_run).findings}
    assert fired == {rule}


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_cards_are_accepted(path: Path) -> None:
    result = validate_file(path)
    assert result.valid, [f.line() for f in result.findings]
    assert result.cards


def test_valid_cards_against_the_run(corpus_run: Path) -> None:
    for name in ("en_failure_section.yaml", "zh_permission_denial.yaml"):
        result = validate_file(CARDS / "valid" / name, corpus_run)
        assert result.valid, [f.line() for f in result.findings]


def test_no_receipt_means_unconfirmed_with_the_confirm_command(tmp_path: Path) -> None:
    run = make_run(tmp_path, confirmed=False)
    findings = validate_file(CARDS / "valid" / "en_failure_section.yaml", run).findings
    assert [f.rule for f in findings] == ["V-RUN-WEAKNESS-UNCONFIRMED"]
    assert "lunasol confirm" in findings[0].message


@pytest.fixture(scope="module")
def seed_cards() -> list[dict[str, object]]:
    if not SEED.is_file():
        pytest.skip(f"seed not available: {SEED}")
    blocks = seed_yaml_blocks()
    assert len(blocks) == 2
    return [parse_entries(b)[0] for b in blocks]


def test_seed_cards_pass_one_by_one(seed_cards: list[dict[str, object]]) -> None:
    assert [c["proposal_id"] for c in seed_cards] == ["P-01", "P-02"]
    for card in seed_cards:
        result = validate_entries([card])
        assert result.valid, [f.line() for f in result.findings]


def test_seed_cards_together_are_not_duplicates(seed_cards: list[dict[str, object]]) -> None:
    result = validate_entries(seed_cards)
    assert result.valid, [f.line() for f in result.findings]


def test_similarity_calibration(seed_cards: list[dict[str, object]]) -> None:
    """Every pair of valid cards (all files, the seed's, the demo's) stays below the threshold; paraphrases above."""
    import json
    from itertools import combinations

    from pipeline.artifacts.proposal_card import ProposalCard
    from pipeline.validator.similarity import THRESHOLD, similarity

    entries = [e for p in VALID for e in parse_entries(p.read_text(encoding="utf-8"))] + list(seed_cards)
    demo = Path(__file__).resolve().parents[2] / "fixtures" / "answers" / "h0-demo" / "proposer" / "W-01.json"
    entries += json.loads(demo.read_text(encoding="utf-8"))["proposals"]
    cards = [ProposalCard.model_validate(e) for e in entries]
    assert len(cards) >= 14
    highest = max(similarity(a, b) for a, b in combinations(cards, 2))
    assert highest < THRESHOLD - 0.05
    for path in sorted((CARDS / "invalid").glob("V-DUPLICATE-STRATEGY__*.yaml")):
        a, b = (ProposalCard.model_validate(e) for e in parse_entries(path.read_text(encoding="utf-8")))
        assert similarity(a, b) >= THRESHOLD
