"""lunasol report: one self-contained, escaped HTML page whose every cited id shows its frozen raw lines.

The runs are built synthetically (see tests/test_diff.py: a generated bundle with one hostile log
line, exported to a real IR, plus small hand-written artifacts).
"""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.report import render_report, write_report
from tests.diff.test_diff import CONTROLLER_REF, HOSTILE, build_run, hostile_event  # the synthetic run builder

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("report"))


def bundle_lines(run_dir: Path, ref: str) -> list[str]:
    """The raw lines of a ref, read straight from the bundle's bytes (independently of the report)."""
    m = re.fullmatch(r"(?P<path>[^#]+)#L(?P<a>\d+)-L(?P<b>\d+)", ref)
    assert m, ref
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    raw = (bundle / m["path"]).read_bytes().decode("utf-8").split("\n")
    return raw[int(m["a"]) - 1 : int(m["b"])]


def manifest_sha(run_dir: Path, rel: str) -> str:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    files = json.loads((bundle / "manifest.json").read_text())["files"]
    return next(f["sha256"] for f in files if f["path"] == rel)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset", "poster", "data") and value is not None:
                self.urls.append((tag, name, value))


def test_report_is_self_contained_and_escaped(run_dir: Path) -> None:
    html, stats = render_report(run_dir)
    parser = _Collect()
    parser.feed(html)
    # No network or file assets: only in-page anchors and data: URLs.
    assert all(v.startswith("#") or v.startswith("data:") for _, _, v in parser.urls), parser.urls
    assert parser.tags.count("script") == 1 and "link" in parser.tags  # the data: favicon only
    assert "default-src 'none'" in html
    # The hostile log line is text, not markup.
    assert "window.__pwned" in html
    assert "<script>window.__pwned" not in html and "<img src=x" not in html
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned" in html
    assert "<b>bold?</b>" not in html and "&lt;b&gt;bold?&lt;/b&gt;" in html
    assert stats["refs"] == 7 and stats["hash_mismatches"] == 0 and stats["unresolved"] == 0


def test_report_sections_and_embedded_lines_match_the_bundle(run_dir: Path) -> None:
    html, _ = render_report(run_dir)
    for section in ("summary", "coverage", "patterns", "groups", "weaknesses", "proposals", "gates", "calls", "raw"):
        assert f'<section id="{section}">' in html
    assert "gate 1: confirm" in html and "gate 1: reject" in html
    # Each embedded snippet: its lines are exactly the bundle's lines of its ref.
    blocks = re.findall(r'<div class="raw" id="(raw-[0-9a-f]+)".*?</div>\n(?=<div class="raw"|</section>)', html, re.S)
    assert len(blocks) == 7
    import html as htmllib

    for block in re.findall(r'<div class="raw" id="raw-[0-9a-f]+".*?(?=<div class="raw"|</section>)', html, re.S):
        ref = htmllib.unescape(re.search(r'<code class="ref-text">(.*?)</code>', block).group(1))
        shown = [htmllib.unescape(t) for t in re.findall(r'<span class="txt">(.*?)</span></div>', block, re.S)]
        assert shown == bundle_lines(run_dir, ref)


def test_report_is_deterministic_and_written_atomically(run_dir: Path, tmp_path: Path) -> None:
    path, stats = write_report(run_dir)
    assert path == run_dir / "report.html"
    first = path.read_bytes()
    assert write_report(run_dir)[0].read_bytes() == first
    assert stats["bytes"] == len(first)
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    res = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").read_bytes() == first
    assert "7 refs embedded, 0 hash mismatches" in res.output


def test_partial_run_renders(run_dir: Path) -> None:
    partial = run_dir.parent / "partial-report"
    shutil.copytree(run_dir, partial, ignore=shutil.ignore_patterns("*.json*", "*.yaml", "gates", "report.html"))
    shutil.copy(run_dir / "run.json", partial / "run.json")
    html, stats = render_report(partial)
    assert "No patterns.jsonl" in html and "No weakness shortlist" in html and "No proposals.yaml" in html
    assert stats["refs"] == 0


def test_blocked_run_shows_the_receipt_and_the_unblock_command(run_dir: Path) -> None:
    blocked = run_dir.parent / "blocked-report"
    shutil.copytree(run_dir, blocked, ignore=shutil.ignore_patterns("weakness-shortlist.json", "proposals.yaml"))
    receipt = {"stage": "sol", "constraint_class": "missing_data", "blocking_constraint": "no recording for <sol>",
               "requested_unblock": "lunasol run B --record DIR && echo '<x>'", "tried_actions": []}  # fmt: skip
    (blocked / "block-receipt.json").write_text(json.dumps(receipt))
    html, _ = render_report(blocked)
    assert "Blocked at sol" in html and "missing_data" in html
    assert "lunasol run B --record DIR &amp;&amp; echo &#39;&lt;x&gt;&#39;" in html
    assert "No weakness shortlist" in html


def test_changed_bundle_bytes_are_not_embedded(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    target = tmp_path / "bundle" / "cells/C001/controller.jsonl"
    target.write_bytes(target.read_bytes().replace(b"stage", b"STAGE", 1))
    html, stats = render_report(run)
    assert stats["hash_mismatches"] >= 1
    block = re.search(r'data-key="cells/C001/controller.jsonl#L1-L2".*?(?=<div class="raw"|</section>)', html, re.S)
    assert block and 'data-status="hash_mismatch"' in block.group(0) and '<span class="txt">' not in block.group(0)


def test_report_bad_run_is_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "run directory not found" in res.output


@pytest.mark.browser
def test_report_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail("Debian chromium is required: apt-get install -y chromium (.ci/run does it)")
    from playwright.sync_api import sync_playwright

    page_path, _ = write_report(run_dir, out=tmp_path / "report.html")
    hostile = hostile_event(run_dir)
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            assert page.title() == f"lunasol report — {run_dir.name}"
            for key in (hostile, CONTROLLER_REF):
                page.locator(f'#weaknesses a.ref:text-is("{key}")').first.click()
                page.wait_for_selector("#viewer:not([hidden])")
                viewer = page.locator("#viewer-body")
                ref = viewer.locator("code.ref-text").inner_text()
                shown = viewer.locator(".line .txt").all_inner_texts()
                assert shown == bundle_lines(run_dir, ref), key
                assert viewer.locator(".badge").first.inner_text() == "verified"
                assert viewer.locator("code.sha").inner_text() == manifest_sha(run_dir, ref.split("#")[0])
                if key == hostile:  # the hostile line is shown as text, exactly as logged
                    assert json.loads(shown[0])["content"] == HOSTILE
            # An in-page link to a pattern group opens its (collapsed) card.
            page.locator('#weaknesses a.internal:text-is("G-01")').first.click()
            page.wait_for_function("document.getElementById('group-G-01').open === true")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=False)
            assert page.evaluate("typeof window.__pwned") == "undefined"
            page.keyboard.press("Escape")
            assert page.locator("#viewer").is_hidden()
        finally:
            browser.close()
    assert errors == [] and dialogs == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert (tmp_path / "report.png").stat().st_size > 10_000
