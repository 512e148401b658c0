"""Issue 22, items 2, 3 and 5: a real MCP server from PyPI behind the mcp adapter.

``mcp-server-git`` (the reference servers' git server; 2026.10.19 requires
``mcp>=2.3,<3``, the version in use) has a tool whose key is a *name*:
``git_create_branch`` answers in text, "Created branch 'X' from 'main'", and a resend
"Cannot create branch 'X': refs/heads/X already exists". It refuses a name that starts
with ``-`` (flag injection), which a base64url key does one time in 64: the contract
writes the key as ``eb-{key}`` in hex. Skipped, with the reason, where it does not
install.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from effect_broker.adapters.base import DispatchRequest
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.conformance_kit import ConformanceKit
from effect_broker.adapters.mcp_adapter import McpAdapter
from effect_broker.domain.contracts import EffectContract, parse_contracts
from effect_broker.domain.errors import OutcomeUnknownError
from effect_broker.domain.keys import downstream_key, spell_key

pytest.importorskip(
    "mcp_server_git", reason="mcp-server-git is not installed (pip install -e '.[dev]')"
)

TENANT_KEY = b"g" * 32


def contract(repo: Path, *, alphabet: str, template: str = "eb-{key}") -> EffectContract:
    return next(
        iter(
            parse_contracts(f"""
[[contract]]
name = "git.branch"
version = "1"
safety = "idempotent"
key_retention = "3650d"
adapter = "mcp"
key_template = "{template}"
key_alphabet = "{alphabet}"
[contract.upstream]
command = "{sys.executable}"
args = ["-m", "mcp_server_git", "--repository", "{repo}"]
tool = "git_create_branch"
key_argument = "branch_name"
timeout = "20s"
connect_timeout = "20s"
[contract.upstream.answer]
pattern = "Created branch|already exists"
committed = ["Created branch"]
already_done = ["already exists"]
""")
        )
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    for command in (
        ["git", "init", "-q", "-b", "main"],
        [
            "git",
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "start",
        ],
    ):
        subprocess.run(command, cwd=path, check=True)
    return path


def branches(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "branch", "--format=%(refname:short)"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(line for line in out.splitlines() if line != "main")


def dispatch(adapter: McpAdapter, repo: Path, operation_key: str):  # type: ignore[no-untyped-def]
    key = downstream_key(TENANT_KEY, "tenant", operation_key)
    arguments = {"repo_path": str(repo)}
    record = make_effect_record(adapter.contract, operation_key, arguments, key)
    return key, adapter.dispatch(
        DispatchRequest(
            effect=record,
            arguments=arguments,
            attempt_id=str(uuid.uuid4()),
            contract=adapter.contract,
        )
    )


def dashed_operation_key() -> str:
    """An operation key whose base64url downstream key starts with '-'."""
    for n in range(10_000):
        candidate = f"branch:{n}"
        if downstream_key(TENANT_KEY, "tenant", candidate).startswith("-"):
            return candidate
    raise AssertionError("no dashed key in 10,000 tries")


def test_a_resend_answered_already_exists_is_one_branch(repo: Path) -> None:
    # Given the real git server, and a key that base64url would start with "-"
    adapter = McpAdapter(contract(repo, alphabet="hex"))
    operation_key = dashed_operation_key()
    # When the first attempt creates the branch and a resend follows (its answer lost)
    key, first = dispatch(adapter, repo, operation_key)
    _, again = dispatch(adapter, repo, operation_key)
    # Then both are the one commit: "Created branch", then "already exists" as evidence
    name = "eb-" + spell_key(key, "hex")
    assert first.output == {"text": f"Created branch '{name}' from 'main'"}
    assert again.output["already_done"] == "already exists"
    assert f"refs/heads/{name} already exists" in str(again.output["text"])
    # And the repository, the upstream's own store, holds one branch under the key
    assert branches(repo) == [name]


def test_a_base64url_key_starting_with_a_dash_is_refused_by_the_real_server(
    repo: Path,
) -> None:
    # Given the key written as it is (the default alphabet, no template)
    adapter = McpAdapter(contract(repo, alphabet="base64url", template="{key}"))
    # When its base64url spelling starts with "-"
    # Then the real server refuses the name (flag injection), an isError with no
    # documented code: unknown, and no branch was made
    with pytest.raises(OutcomeUnknownError):
        dispatch(adapter, repo, dashed_operation_key())
    assert branches(repo) == []


def test_the_conformance_kit_proves_the_branch_key_and_fails_drift(repo: Path) -> None:
    # Given the real git server as an idempotent upstream whose key is a branch name
    kit = ConformanceKit(
        contract(repo, alphabet="hex"),
        arguments={"repo_path": str(repo)},
        attempt_limit=10.0,
    )
    # When the kit runs it behind its stdio wrapper
    rows = {row.check: row for row in kit.run()}
    # Then a key takes effect once however often it is sent: the resends' "already
    # exists" is read as the same effect
    assert rows["same_key_one_effect"].outcome == "pass"
    assert rows["same_key_one_effect"].evidence == (
        "3 requests under one key made 1 effect (named by its key); 2 answered "
        "already done"
    )
    assert rows["lost_answer"].outcome == "pass"
    assert "resend: already done (already exists)" in rows["lost_answer"].evidence
    assert rows["slow_answer"].outcome == "pass"
    # And a branch cannot tell another payload from the same one: drift FAILs
    assert rows["drift_refused"].outcome == "FAIL"
    assert "not refused" in rows["drift_refused"].evidence
    # (answers, same key, lost, slow, drift: five branches, one per effect)
    assert len(branches(repo)) == 5
