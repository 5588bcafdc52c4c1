"""Every secret kind planted in one bundle, a whole run made through the local server, and every output grepped.

The 16 kinds that held before (provider and cloud keys, tokens, JWTs, private keys, database URLs,
bearer and basic headers, high-entropy values after their names) and the 5 that leaked (an Azure
connection string's key, a secret inside a base64 blob, ``password=hunter2``-style values in every
form, a secret cut across two lines of one message, a secret in a file name). Grepped: every request
the server got (the prompts), the recordings, every file of the run directory (IR bytes included),
the Parquet export, report.html with its chunks inflated, and stdout/stderr of each command.
The planted values are fake but have the real formats.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.cli.app import app
from pipeline.ir.redact import display_paths, redact_path
from pipeline.report.build import read_page_data
from pipeline.testing.openai_server import FakeOpenAI
from tests.sol.sol_helpers import make_bundle
from tests.state.test_ledger import handler as ledger_handler

runner = CliRunner()

# -- the 16 kinds that held ------------------------------------------------------------------------
OPENAI = "sk-proj-Ab3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd"
ANTHROPIC = "sk-ant-api03-QwErTyUiOp0123456789AsDfGhJkLzXcVbNm"
AWS_ID = "AKIAQWERTYU1OPASDFGH"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12"
GITHUB = "ghp_R2d2C3poL8kE9yW1qZ7xV5bN3mA6sD4fG0hJ"
GITLAB = "glpat-Zx8Cv7Bn6Mm5Ll4Kk3Jj2"
SLACK = "xoxb-2048-1234567890-AbCdEfGhIjKlMnOp"
STRIPE = "sk_live_Qa1Ws2Ed3Rf4Tg5Yh6Uj7Ik8"
GOOGLE = "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
BEARER = "x9Yk2Lm4Np6Qr8St0Uv2Wx4Yz6Ab8Cd"
BASIC = "dXNlcjpwYXNzd29yZDEyMzQ1Ng=="
DB_PASSWORD = "pgPassw0rdQ77x"
KEY_LINE = "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
PRIVATE_KEY = f"-----BEGIN RSA PRIVATE KEY-----\n{KEY_LINE}\n-----END RSA PRIVATE KEY-----"
CLIENT_SECRET = "Zq8Wm3Nx7Lp2Kr5Tv9Yb"
# -- the 5 kinds that leaked -----------------------------------------------------------------------
AZURE_KEY = "Kq9vT3xWm2Lp8Rn5Yb7Zc4Df6Gh1Jk0Mn2Pq4Rs6Tu8Vw0Xy2Za4Bc6De8Fg0Hi2Jk4Lm6No8Pq0Rs2Tu4Vw6Xy8Za0Bc2=="
SAS_SIG = "AbCd%2BeFgH1jK2lMn3oPq4RsT5uVw6%3D"
K8S_PASSWORD = "k8sDbPass"  # low entropy, only ever written base64-encoded in the dump
K8S_BLOB = base64.b64encode(f"postgres://app:{K8S_PASSWORD}@db.internal:5432/app".encode()).decode()
K8S_KEY_BLOB = base64.b64encode(f"OPENAI_API_KEY={OPENAI[:-4]}WXYZ".encode()).decode()
PASSWORDS = ["hunter2", "letmein99", "tr0ub4dor", "qwerty7", "dragon12", "s3cret"]
SPLIT = "ghp_Sp1itAcr0ssTw0L1nesOfOneMessage9876"
SPLIT_HALVES = [SPLIT[:21], SPLIT[21:]]
NAME_SECRET = "sk-ant-api03-FileNameK3yZ0123456789abcdefXYZ"

SECRETS = {
    "openai": OPENAI, "anthropic": ANTHROPIC, "aws-id": AWS_ID, "aws-secret": AWS_SECRET, "github": GITHUB,
    "gitlab": GITLAB, "slack": SLACK, "stripe": STRIPE, "google": GOOGLE, "jwt": JWT, "bearer": BEARER,
    "basic": BASIC, "db-url": DB_PASSWORD, "private-key": KEY_LINE, "client-secret": CLIENT_SECRET,
    "azure-key": AZURE_KEY, "sas": SAS_SIG, "k8s-blob": K8S_BLOB, "k8s-key-blob": K8S_KEY_BLOB,
    "k8s-password": K8S_PASSWORD, "split-1": SPLIT_HALVES[0], "split-2": SPLIT_HALVES[1], "file-name": NAME_SECRET,
    **{f"password-{i}": p for i, p in enumerate(PASSWORDS)},
}  # fmt: skip
PLANTED = f"cells/C001/sessions/10-review-{NAME_SECRET}.jsonl"


def _leaks(text: str) -> list[str]:
    """The planted secrets in ``text``, as written and JSON-escaped."""
    escaped = json.dumps(text)
    return sorted(k for k, s in SECRETS.items() if s in text or json.dumps(s)[1:-1] in escaped)


def _plant(bundle: Path) -> None:
    ts = "2099-01-02T00:00:{:02d}Z"  # after every other event: the tiny bundle's other event ids stay
    azure = (
        f"DefaultEndpointsProtocol=https;AccountName=lunasolacct;AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net"
    )
    sas = f"https://lunasolacct.blob.core.windows.net/c/b.txt?sv=2022-11-02&ss=b&sp=r&sig={SAS_SIG}&se=2030-01-01"
    dump = (
        "apiVersion: v1\nkind: Opaque\nmetadata:\n  name: app-config\n"
        f"data:\n  DATABASE_URL: {K8S_BLOB}\n  settings.env: {K8S_KEY_BLOB}\n"
    )
    rows: list[dict[str, Any]] = [
        {"ts": ts.format(0), "type": "message", "role": "reviewer", "content": f"keys {OPENAI} and {ANTHROPIC}"},
        {
            "ts": ts.format(1),
            "type": "tool_call",
            "call_id": "p1",
            "tool": "shell",
            "args": {
                "command": f"curl -H 'Authorization: Bearer {BEARER}' -H 'Authorization: Basic {BASIC}' x",
                "env": {
                    "AWS_ACCESS_KEY_ID": AWS_ID,
                    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
                    "SLACK": SLACK,
                    "GH": GITHUB,
                    "GL": GITLAB,
                    "STRIPE": STRIPE,
                    "GOOGLE": GOOGLE,
                    "SESSION": JWT,
                },
                "url": f"postgres://admin:{DB_PASSWORD}@db.example.com:5432/app",
            },
        },
        {"ts": ts.format(2), "type": "tool_result", "call_id": "p1", "tool": "shell", "output": PRIVATE_KEY},
        {"ts": ts.format(3), "type": "message", "role": "reviewer", "content": f'"client_secret":"{CLIENT_SECRET}"'},
        {"ts": ts.format(4), "type": "message", "role": "reviewer", "content": f"storage: {azure}\nsas: {sas}"},
        {"ts": ts.format(5), "type": "tool_result", "call_id": "p2", "tool": "shell", "output": dump},
        {
            "ts": ts.format(6),
            "type": "message",
            "role": "reviewer",
            "content": (
                f"password={PASSWORDS[0]}\ndb:\n  password: {PASSWORDS[1]}\n"
                f'{{"passwd": "{PASSWORDS[2]}"}}\nexport DB_PASSWORD={PASSWORDS[3]}\n'
                f"mysql -u root --password {PASSWORDS[4]}\nsecret: {PASSWORDS[5]}"
            ),
        },
        {
            "ts": ts.format(7),
            "type": "message",
            "role": "reviewer",
            "content": f"the deploy token is {SPLIT_HALVES[0]}\n{SPLIT_HALVES[1]} (wrapped by the terminal)",
        },
    ]
    (bundle / PLANTED).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    freeze(bundle)


def _grep_tree(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        leaks = _leaks(str(path.relative_to(root)))
        if path.is_file():
            leaks += _leaks(path.read_bytes().decode("utf-8", errors="replace"))
        if leaks:
            found[str(path.relative_to(root))] = sorted(set(leaks))
    return found


def test_every_planted_secret_kind_stays_out_of_every_output(
    tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    fake_llm.handler = ledger_handler
    bundle = make_bundle(tmp_path)
    _plant(bundle)
    raw = (bundle / PLANTED).read_text(encoding="utf-8")
    # every kind is really planted (the Kubernetes password only base64-encoded: it leaks decoded, if at all)
    assert _leaks(raw + PLANTED) == sorted(set(SECRETS) - {"k8s-password"})
    s = model_settings()
    store = tmp_path / "store"
    res = runner.invoke(
        app,
        ["run", str(bundle), "--runs-dir", str(runs_dir), "--run-id", "p", "--model", s.model,
         "--api-base", s.api_base, "--mode", "tools", "--record", str(store)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    outputs = {"run stdout": res.stdout, "run stderr": res.stderr}
    run_dir = runs_dir / "p"

    assert fake_llm.requests, "the run sent prompts"
    prompts = json.dumps(fake_llm.requests, ensure_ascii=False)
    assert _leaks(prompts) == []
    assert "[REDACTED:named-secret]" in prompts and "[REDACTED:base64-secret]" in prompts
    assert "[REDACTED:connection-string-key]" in prompts  # the planted events reached Luna, redacted

    recordings = [p for p in store.rglob("*") if p.is_file()]
    assert recordings and _grep_tree(store) == {}

    parquet = tmp_path / "parquet"
    exported = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(tmp_path / "x"), "--parquet",
                                   str(parquet / "ir")])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    tables = runner.invoke(app, ["export-tables", str(run_dir), "--parquet", str(parquet / "tables")])
    assert tables.exit_code == 0, tables.output
    outputs |= {"export stdout": exported.stdout, "export stderr": exported.stderr, "tables": tables.output}
    assert list(parquet.rglob("*.parquet")) and _grep_tree(parquet) == {}
    assert _grep_tree(tmp_path / "x") == {}

    report = runner.invoke(app, ["report", str(run_dir)])
    assert report.exit_code == 0, report.output
    outputs |= {"report stdout": report.stdout, "report stderr": report.stderr}
    # the shards inflated: timelines, raw lines, occurrences and the search index's words
    assert _leaks(json.dumps(read_page_data(run_dir / "report"), ensure_ascii=False)) == []
    assert _grep_tree(run_dir) == {}  # report/, ir.duckdb's bytes, verified-files.json, calls, ...

    status = runner.invoke(app, ["status", str(run_dir)])
    outputs |= {"status stdout": status.stdout, "status stderr": status.stderr}
    assert {k: _leaks(v) for k, v in outputs.items() if _leaks(v)} == {}

    # the shown path still resolves to the raw bytes (hash-checked); show-ref prints them redacted
    shown = redact_path(PLANTED)
    assert shown == "cells/C001/sessions/10-review-REDACTED-anthropic-key.jsonl"
    ref = runner.invoke(app, ["show-ref", f"{shown}#L5-L8", "--run", str(run_dir)])
    assert ref.exit_code == 0, ref.output
    assert _leaks(ref.stdout) == [] and "[REDACTED:connection-string-key]" in ref.stdout
    as_raw = runner.invoke(app, ["show-ref", f"{shown}#L1-L1", "--run", str(run_dir), "--unredacted"])
    assert as_raw.exit_code == 0 and OPENAI in as_raw.stdout  # the user's own bytes, when asked


def test_a_secret_in_a_directory_name_is_shown_redacted_and_two_alike_stay_apart() -> None:
    paths = ["cells/C1/password=hunter2/a.jsonl", "cells/C1/password=letmein9/a.jsonl", "cells/C1/plain.jsonl"]
    shown = display_paths(paths)
    assert shown == {
        paths[0]: "cells/C1/password=REDACTED-named-secret/a.jsonl",
        paths[1]: "cells/C1/password=REDACTED-named-secret-2/a.jsonl",
    }
    assert display_paths(["cells/C1/sessions/01-review.jsonl"]) == {}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net", "connection-string-key"),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=aB3dE6gH9jK2mN5pQ8sT=",
            "connection-string-key",
        ),
        ("SharedAccessSignature=sv=2022-11-02&sig=AbC%2Bd&se=2030", "connection-string-key"),
        (f"sv=2022&sig={SAS_SIG}&se=1", "connection-string-key"),
        ("password=hunter2", "named-secret"),
        ("db:\n  password: hunter2\n", "named-secret"),
        ('{"password": "hunter2"}', "named-secret"),
        ('{\\"passwd\\": \\"hunter2\\"}', "named-secret"),
        ("export PGPASSWORD=hunter2", "named-secret"),
        ("MYSQL_PWD=hunter2", "named-secret"),
        ("'secret' => 'abc123'", "named-secret"),
        ("token: abc-123", "named-secret"),
        ("API_KEY=abcdefghijkl", "named-secret"),
        (f"data:\n  url: {K8S_BLOB}", "base64-secret"),
        (f"key {OPENAI[:20]}\n{OPENAI[20:]} end", "openai-key"),
        (f"key {OPENAI[:20]}\r\n{OPENAI[20:]} end", "openai-key"),
    ],
)
def test_each_new_kind_is_found(text: str, kind: str) -> None:
    from pipeline.ir.redact import redact, redact_column

    out, n = redact(text)
    assert n >= 1 and f"[REDACTED:{kind}]" in out, out
    assert redact_column(["plain", text]) == (["plain", out], n)  # the column form finds it too
    assert out.count("\n") == text.count("\n")  # a split secret keeps its line breaks


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 4096",
        "token: 4096",
        "Token::StructVariant { name: x }",
        "if token == other {",
        "API Token: Follow the steps",
        "let token = try parse()",
        "Enter password:\nLogin successful",
        "password: ********",
        "password=${DB_PASSWORD}",
        "secret: true",
        "PWD=/home/user/project",
        "sha256:4e196a4f94d014b193992633e2fa079f2f6057782fc3a04ce6ed8f4d9c58a08c",
        "aGVsbG8gd29ybGQsIHRoaXMgaXMganVzdCBwcm9zZQ==",  # base64 of prose: decoded, nothing found, kept
        "cells/C001/sessions/09-review-reviewer.jsonl",
    ],
)
def test_new_look_alikes_are_kept(text: str) -> None:
    from pipeline.ir.redact import redact

    assert redact(text) == (text, 0)
