"""The official Durable Streams server conformance suite against ``sessionstore serve``.

The suite (``@durable-streams/server-conformance-tests``, pinned in tests/ds-node/, installed by
``.ci/run``) runs under vitest against real ``sessionstore serve`` processes:

* two processes on one S3 prefix and one Redis, behind HAProxy (round robin, request by request: ``harness.haproxy``) that spreads the
  suite's requests over both (every S3 backend: ``[moto]``, ``[seaweedfs]``, ``[external]``);
* one process on the embedded default (a local directory and its embedded redis-server).

Every test of the suite must pass; the only skipped ones may be the optional "Reserved
subscription APIs" block (it runs only with the suite's ``subscriptions`` option), so a test
the suite newly skips fails here. Without node or tests/ds-node/node_modules the tests skip,
except under ``CI``, where they fail. Each test of the suite may take up to 60 s
(tests/ds-node/vitest.config.mjs) instead of vitest's default 5 s: a wall-clock budget is a
timing assertion, which this suite does not make; what each test asserts is the suite's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import _in_ci
from harness.haproxy import HaproxyBalancer, require_haproxy
from harness.serve_process import ServeProcess, cli, serve, server_env

DS_NODE = Path(__file__).resolve().parent / "ds-node"
REPO = DS_NODE.parent.parent

#: The suite's optional block: skipped unless runConformanceTests gets ``subscriptions: true``.
SUBSCRIPTIONS_BLOCK = "Reserved subscription APIs"
#: Exactly the tests the suite may skip: (describe blocks, title).
EXPECTED_SKIPPED = frozenset(
    ((SUBSCRIPTIONS_BLOCK,), title)
    for title in (
        "creates and idempotently re-confirms a webhook subscription",
        "rejects unsafe webhook URLs",
        "webhook synchronous done auto-acks the wake snapshot",
        "webhook callback acks and fences stale wake generations",
        "adds and removes explicit subscription streams",
        "pull-wake claim, ack, and release use subscription-scoped leases",
    )
)
MIN_TESTS = 300  # 338 in server-conformance-tests 0.3.6
SUITE_TIMEOUT_S = 900

pytestmark = pytest.mark.timeout(SUITE_TIMEOUT_S + 300)


# --- sessionstore serve ----------------------------------------------------------------------


# --- the conformance suite -------------------------------------------------------------------


def _require_suite() -> None:
    """Skip (fail under CI) unless node, npx and tests/ds-node/node_modules are there."""
    missing = [tool for tool in ("node", "npx") if shutil.which(tool) is None]
    if not (DS_NODE / "node_modules" / ".bin" / "vitest").exists() or not (
        DS_NODE / "node_modules" / "@durable-streams" / "server-conformance-tests"
    ).is_dir():
        missing.append("tests/ds-node/node_modules (npm ci --prefix tests/ds-node)")
    if not missing:
        return
    if _in_ci():
        pytest.fail(f"CI must run the Durable Streams conformance suite (see .ci/run), but "
                    f"{', '.join(missing)} missing", pytrace=False)
    pytest.skip(f"{', '.join(missing)} missing: run .ci/run once")


@dataclass
class SuiteRun:
    """One vitest run of the suite: its exit code, its JSON report and its console output."""

    returncode: int
    report: dict[str, Any]
    output: str

    @property
    def tests(self) -> list[dict[str, Any]]:
        return [t for file in self.report.get("testResults", []) for t in file.get("assertionResults", [])]

    def with_status(self, *statuses: str) -> list[dict[str, Any]]:
        return [t for t in self.tests if t.get("status") in statuses]

    @property
    def skipped(self) -> set[tuple[tuple[str, ...], str]]:
        return {(tuple(t.get("ancestorTitles", [])), t["title"]) for t in self.with_status("skipped", "pending", "todo")}

    def failures(self, detailed: int = 40, limit: int = 1000) -> str:
        """Each failing test's name, duration and the start of its error (the first
        ``detailed`` of them; the rest by name only)."""
        lines = []
        for n, test in enumerate(self.with_status("failed")):
            name = " > ".join([*test.get("ancestorTitles", []), test["title"]])
            head = f"FAILED [{name}] ({test.get('duration') or 0:.0f} ms)"
            if n >= detailed:
                lines.append(head)
                continue
            message = (self.console_error(name) or "\n".join(test.get("failureMessages", [])))[:limit].strip()
            lines.append(head + "\n    " + message.replace("\n", "\n    "))
        for file in self.report.get("testResults", []):  # a file that could not even load
            if file.get("status") == "failed" and file.get("message"):
                lines.append(f"FILE FAILED {file.get('name')}: {file['message'][:limit]}")
        return "\n".join(lines)

    def console_error(self, name: str) -> str:
        """The error the console reporter printed under `` FAIL  FILE > name``: the JSON
        report has only a placeholder stack for some (timeouts: "STACK_TRACE_ERROR")."""
        at = self.output.find(f"> {name}\n")
        if at < 0:
            return ""
        block = self.output[at:].split("\n")[1:]
        while block and block[0].lstrip().startswith("FAIL "):  # tests that share the error
            block = block[1:]
        text = []
        for line in block:
            if line.startswith("\u23af"):  # vitest's ⎯⎯⎯ separator
                break
            text.append(line)
        return "\n".join(text)


def run_suite(base_url: str, work: Path) -> SuiteRun:
    """``npx vitest run`` of tests/ds-node/conformance.test.mjs against ``base_url``."""
    report_path = work / "conformance-report.json"
    command = ["npx", "--no", "vitest", "run", "--no-color", "--reporter=default", "--reporter=json",
               f"--outputFile.json={report_path}"]
    env = {**os.environ, "CONFORMANCE_TEST_URL": base_url, "NO_COLOR": "1"}
    try:
        done = subprocess.run(command, cwd=DS_NODE, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=SUITE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"the conformance suite did not finish within {SUITE_TIMEOUT_S}s:\n{output[-5000:]}",
                    pytrace=False)
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    (work / "conformance-output.txt").write_text(output)
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        pytest.fail(f"vitest wrote no JSON report ({exc}); exit {done.returncode}:\n{output[-5000:]}", pytrace=False)
    return SuiteRun(done.returncode, report, output)


def check_suite(run: SuiteRun, servers: Sequence[ServeProcess], extra: str = "") -> None:
    """Every test passed, enough of them ran, and only the subscription block was skipped;
    otherwise fail with the failing tests' names and messages and the servers' logs."""
    failed = run.with_status("failed")
    problems = []
    if run.returncode != 0:
        problems.append(f"vitest exited with {run.returncode}")
    if failed:
        problems.append(f"{len(failed)} conformance test(s) failed")
    if len(run.tests) <= MIN_TESTS:
        problems.append(f"only {len(run.tests)} tests ran (expected more than {MIN_TESTS})")
    if run.skipped != EXPECTED_SKIPPED:
        unexpected = sorted(" > ".join([*a, t]) for a, t in run.skipped - EXPECTED_SKIPPED)
        no_longer = sorted(" > ".join([*a, t]) for a, t in EXPECTED_SKIPPED - run.skipped)
        problems.append(f"skipped tests differ from the {SUBSCRIPTIONS_BLOCK!r} block: newly skipped "
                        f"{unexpected}, no longer skipped {no_longer}")
    if not problems:
        return
    counts = (f"{len(run.tests)} tests: {len(run.with_status('passed'))} passed, {len(failed)} failed, "
              f"{len(run.skipped)} skipped")
    logs = "\n".join(f"--- sessionstore serve {s.url} ({s.log_path}):\n{s.log()}" for s in servers)
    message = "\n".join([
        "; ".join(problems), counts, extra, run.failures(),
        f"--- vitest output (end):\n{run.output[-3000:]}", logs,
    ])
    pytest.fail(message, pytrace=False)


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.long
def test_conformance_two_servers_on_s3_and_redis_behind_a_balancer(
    s3_url: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """Two processes sharing S3 and Redis, every other request to the other one: a stream
    created through one is read, appended to, long-polled and tailed by SSE through both."""
    _require_suite()
    require_haproxy()
    store_args = ["--objects", s3_url, "--redis", redis_url, "--redis-prefix", redis_prefix]
    with ExitStack() as stack:
        servers = [stack.enter_context(serve(store_args, tmp_path / f"serve-{i}.log", cwd=tmp_path)) for i in range(2)]
        balancer = stack.enter_context(HaproxyBalancer([s.url for s in servers]))
        run = run_suite(balancer.url, tmp_path)
        counts, errors = balancer.stats()
    total = sum(counts)
    spread = f"balancer: {counts} requests per server (of {total}); upstream errors: {errors or 'none'}"
    check_suite(run, servers, spread)
    for server, count in zip(servers, counts, strict=True):
        assert count > total * 0.25, f"{server.url} served too small a share: {spread}"


@pytest.mark.long
def test_conformance_one_server_on_the_embedded_default(tmp_path: Path) -> None:
    """``sessionstore --objects DIR serve``: a local directory and its embedded redis-server."""
    _require_suite()
    store_dir = tmp_path / "store"
    try:
        with serve(["--objects", str(store_dir)], tmp_path / "serve.log", cwd=tmp_path) as server:
            run = run_suite(server.url, tmp_path)
    finally:
        subprocess.run(cli("--objects", str(store_dir), "embedded", "stop"), cwd=tmp_path, env=server_env(),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    check_suite(run, [server])
