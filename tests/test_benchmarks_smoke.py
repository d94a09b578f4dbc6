"""The benchmarks' smoke run: every scenario runs at tiny sizes and every figure is produced.

Never asserts a timing (CI machines are shared and noisy): only that ``python -m benchmarks
--smoke`` completes and that its JSON holds every figure, each a finite number.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# Figures every complete run has, whatever its sizes ({n}: each resume size).
ALWAYS = [
    "append.b1.store.p50_ms",
    "append.b1.store.p99_ms",
    "append.b1.floor.p50_ms",
    "append.b1.floor.p99_ms",
    "append.b1.ratio_p50",
    "append.b10.store.p50_ms",
    "append.b10.floor.p50_ms",
    "append.b10.ratio_p50",
    "append.b1.object_requests_per_append",
    "append.b1.redis_commands_per_append",
    "throughput.store.appends_per_s",
    "throughput.floor.puts_per_s",
    "throughput.ratio",
    "contention.store.appends_per_s",
    "contention.floor.segments_per_s",
    "contention.ratio",
    "contention.retries_per_append",
    "contention.lost",
    "local.append.p50_ms",
    "local.append_fsync.p50_ms",
    "local.create_fsync.p50_ms",
    "local.create_vs_append_fsync.ratio_p50",
    "local.protocol_floor.p50_ms",
    "local.embedded_vs_protocol_floor.ratio_p50",
    "listing.sessions",
    "listing.first_page.store_ms",
    "listing.first_page.floor_ms",
    "listing.first_page.ratio",
    "listing.all.store_ms",
    "listing.all.floor_ms",
    "listing.all.ratio",
]
PER_RESUME_SIZE = [
    "resume.{n}.uncompacted.store_ms",
    "resume.{n}.uncompacted.store_load_ms",
    "resume.{n}.uncompacted.store_context_ms",
    "resume.{n}.uncompacted.floor_ms",
    "resume.{n}.uncompacted.ratio",
    "curve.{n}.store_append_ms",
    "curve.{n}.naive_append_ms",
    "curve.{n}.floor_ms",
    "curve.{n}.naive_resume_ms",
    "local.{n}.resume_ms",
]
WITH_COMPACTOR = [
    "resume.{n}.compacted.store_ms",
    "resume.{n}.compacted.floor_ms",
    "resume.{n}.compacted.ratio",
    "compaction.{n}.store_ms",
    "compaction.{n}.floor_ms",
    "compaction.{n}.ratio",
    "compaction.{n}.segments_per_s",
    "compaction.{n}.mb_per_s",
]

# The scale scenario's counted figures, for each population ("scale.<n>.<name>") and as the
# ratio of the last population's to the first's ("scale.ratio.<name>").
SCALE_COUNTED = [
    "append.object_requests", "append.puts", "append.redis_round_trips", "append.redis_commands",
    "resume.uncompacted.object_requests", "resume.uncompacted.redis_round_trips",
    "resume.compacted.object_requests", "resume.compacted.redis_round_trips",
    "compaction.object_requests", "gc.object_requests", "gc.redis_round_trips",
    "gc.idle_object_requests", "gc.empty_pass_object_requests", "gc.empty_pass_redis_round_trips",
    "redis.bytes_per_idle_session", "redis.keys_per_idle_session", "redis.bytes_per_compacted_session",
    "written_per_appended",
]


def _compactor_available() -> bool:
    try:
        from compactor import Compactor
    except ImportError:
        return False
    return callable(getattr(Compactor, "compact_session", None))


def _smoke_run(tmp_path: Path, args: list[str], timeout: float, what: str) -> dict[str, Any]:
    """``python -m benchmarks --smoke ARGS`` on the test's servers (or the external ones the
    suite was given); its results JSON. Fails with its output when the run fails."""
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks", "--smoke", *args, "--out", str(out)]
    s3, redis_url = os.environ.get("SESSIONSTORE_TEST_S3_URL"), os.environ.get("SESSIONSTORE_TEST_REDIS_URL")
    if s3 and redis_url:
        cmd += ["--objects", s3, "--redis", redis_url]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{what} smoke failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    data: dict[str, Any] = json.loads((out / "latest.json").read_text())
    return data


@pytest.mark.long
@pytest.mark.timeout(600)
def test_smoke_run_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results"
    data = _smoke_run(tmp_path, ["--profile"], 540, "benchmark")
    meta = data["meta"]
    assert meta["complete"] is True
    assert meta["params"]["profile"] == "smoke"
    for key in ("machine", "versions", "params", "backend", "command", "git"):
        assert meta[key], key
    figures = data["figures"]

    sizes = meta["params"]["resume_sizes"]
    expected = list(ALWAYS)
    per_size = PER_RESUME_SIZE + (WITH_COMPACTOR if _compactor_available() else [])
    for n in sizes:
        expected += [name.format(n=n) for name in per_size]
    expected += meta["expected_figures"]  # the run's own, fuller list
    missing = [name for name in expected if name not in figures]
    assert not missing, f"figures not produced: {missing}"
    bad = [name for name in expected if not isinstance(figures[name], (int, float)) or not math.isfinite(figures[name])]
    assert not bad, f"figures without a finite value: {bad}"

    # Every target was evaluated (met or not: timings are never asserted here).
    assert data["targets"], "no targets evaluated"
    assert all(t["value"] is not None for t in data["targets"]), data["targets"]
    assert data["table"], "no table rows"
    # The profile ran and wrote its reports.
    assert any(name.startswith("profile.") for name in figures)
    assert (out / "profile-append.txt").exists() and (out / "profile-micro.txt").exists()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert meta["plot"] is None
    else:
        assert meta["plot"] and Path(meta["plot"]).is_file()


@pytest.mark.long
@pytest.mark.timeout(300)
def test_scale_smoke_run_produces_the_counted_figures(tmp_path: Path) -> None:
    """``--only scale`` (optional, so not in the run above): counts, never times."""
    data = _smoke_run(tmp_path, ["--only", "scale", "--no-plot"], 280, "scale benchmark")
    meta, figures = data["meta"], data["figures"]
    assert meta["complete"] is True and meta["scenarios"] == ["scale"]
    missing = [name for name in meta["expected_figures"] if name not in figures]
    assert meta["expected_figures"] and not missing, f"figures not produced: {missing}"
    _check_scale(figures, meta["params"])
    # The longer session: once compacted its ids leave Redis (tail, summary and at most a
    # queued job's marker remain), and once idle it keeps only its tail and summary.
    assert figures["scale.long.compacted.redis_bytes"] < figures["scale.long.uncompacted.redis_bytes"] / 10
    assert figures["scale.long.compacted.redis_bytes"] <= figures["scale.long.idle.redis_bytes"] + 256
    assert figures["scale.long.idle.redis_bytes"] < figures["scale.long.uncompacted.redis_bytes"] / 10


def _check_scale(figures: dict[str, float], params: dict[str, object]) -> None:
    """The scale scenario's figures are counts, not times: each is a number, and one is a
    behaviour: GC makes no request for the sessions at rest (nothing is due for them)."""
    pops = params["scale_populations"]
    assert isinstance(pops, list) and len(pops) >= 2 and all(b == 10 * a for a, b in zip(pops, pops[1:])), pops
    names = [f"scale.{n}.{m}" for n in pops for m in SCALE_COUNTED] + [f"scale.ratio.{m}" for m in SCALE_COUNTED]
    missing = [name for name in names if name not in figures]
    assert not missing, f"scale figures not produced: {missing}"
    bad = [name for name in names if not isinstance(figures[name], (int, float)) or not math.isfinite(figures[name])]
    assert not bad, f"scale figures without a finite value: {bad}"
    for n in pops:
        assert figures[f"scale.{n}.gc.idle_object_requests"] == 0, n
        assert figures[f"scale.{n}.gc.empty_pass_object_requests"] == 0, n
        assert figures[f"scale.{n}.append.object_requests"] >= 1, n


@pytest.mark.timeout(300)
def test_http_smoke_run_produces_the_service_and_library_figures(tmp_path: Path) -> None:
    """``--only http`` (optional, so not in the run above): the HTTP service against the
    library on the same backend, and the service under load (``_check_http_load``). The Node reference server is compared when tests/ds-node is
    installed and reported "not available" otherwise; the HTTP and library figures are
    required either way (the scenario checks every response and what each stream holds, so a
    broken HTTP path fails the run)."""
    data = _smoke_run(tmp_path, ["--only", "http", "--no-plot"], 280, "http benchmark")
    meta, figures = data["meta"], data["figures"]
    assert meta["complete"] is True and meta["scenarios"] == ["http"]
    n = meta["params"]["http_read_messages"]
    required = [
        "http.append.http.p50_ms", "http.append.http.p99_ms", "http.append.library.p50_ms",
        "http.append.library.p99_ms", "http.append.ratio_p50",
        f"http.read.{n}.uncompacted.http_ms", f"http.read.{n}.uncompacted.library_ms",
        f"http.read.{n}.uncompacted.ratio", f"http.read.{n}.uncompacted.http_requests",
    ]
    if _compactor_available():
        required += [f"http.read.{n}.compacted.http_ms", f"http.read.{n}.compacted.library_ms"]
    expected = required + meta["expected_figures"]
    missing = [name for name in expected if name not in figures]
    assert not missing, f"figures not produced: {missing}"
    bad = [name for name in expected if not isinstance(figures[name], (int, float)) or not math.isfinite(figures[name])]
    assert not bad, f"figures without a finite value: {bad}"
    assert figures[f"http.read.{n}.uncompacted.http_requests"] >= 1

    rows = [r for r in data["table"] if r["scenario"] in ("http append (open loop)", "http catch-up read")]
    assert len(rows) == (6 if _compactor_available() else 4), rows
    reference = [r for r in rows if "reference server" in r["case"]]
    if "http.append.reference.p50_ms" in figures:
        assert all(math.isfinite(figures[k]) for k in figures if ".reference" in k)
        assert all(r["ratio"] != "-" for r in reference), reference
    else:  # not installed: said so in the table, the run still complete
        assert all(r["floor"].startswith("not available") or r["floor"].startswith("failed") for r in reference), reference
    _check_http_load(data)


def _check_http_load(data: dict[str, Any]) -> None:
    """The load scenario's counted figures (issue #37), at smoke size: two serve processes
    behind a balancer, producers, SSE and long-poll followers, readers of a binary stream.
    Correctness only (nothing lost or stored twice, every follower saw every message once, in
    order, every read whole); its times and memory are reported, never asserted here."""
    figures, params = data["figures"], data["meta"]["params"]
    names = [name for name in data["meta"]["expected_figures"] if name.startswith("http.load.")]
    assert "http.load.healthz.p99_ms" in names and "http.load.rss_after_over_start" in names, names
    bad = [name for name in names if not isinstance(figures.get(name), (int, float)) or not math.isfinite(figures[name])]
    assert not bad, f"load figures missing or not finite: {bad}"
    assert figures["http.load.appends"] >= params["http_load_writers"], figures["http.load.appends"]
    assert figures["http.load.lost"] == 0
    assert figures["http.load.duplicated"] == 0
    assert figures["http.load.out_of_order"] == 0
    assert figures["http.load.unacknowledged"] == 0
    assert figures["http.load.followers_complete"] == params["http_load_followers"]
    assert figures["http.load.followers_incomplete"] == 0
    assert figures["http.load.reader.reads"] >= params["http_load_readers"]
    assert figures["http.load.reader.bad_reads"] == 0
    assert figures["http.load.healthz.probes"] >= 1 and figures["http.load.healthz.failures"] == 0
    assert figures["http.load.client_errors"] == 0 and figures["http.load.balancer_errors"] == 0
    # The load's clients ran at the scenario's niceness, the prober at the stack's.
    nice = data["details"]["http_load"]["clients_nice"]
    assert nice.pop("prober") == 0, nice
    assert set(nice.values()) == {params["http_load_clients_nice"]} and params["http_load_clients_nice"] > 0, nice
    targets = {t["name"]: t for t in data["targets"] if t["name"].startswith("http load")}
    assert targets["http load: /healthz p99 through the balancer"]["value"] is not None, targets


def test_without_moto_the_smoke_run_falls_back_to_the_embedded_default(tmp_path: Path) -> None:
    """After the README's first install (`pip install -e '.[embedded]'`) there is no moto: the
    default run uses the embedded default instead of ending in a traceback."""
    out = tmp_path / "results"
    # moto made unimportable in the benchmark's own process (where the backend is chosen).
    code = ("import sys; sys.modules['moto'] = None\n"
            "from benchmarks.cli import main\n"
            f"sys.exit(main(['--smoke', '--only', 'append,local', '--no-plot', '--out', {str(out)!r}]))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert "moto is not installed" in proc.stderr and "embedded default instead" in proc.stderr
    data = json.loads((out / "latest.json").read_text())
    assert data["meta"]["backend"]["kind"] == "embedded"
    assert "append.b1.store.p50_ms" in data["figures"]


# --- packaging: benchmarks run from a checkout, they are not installed ----------------------------


def _pyproject() -> dict[str, object]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_only_the_store_packages_are_discovered_for_the_wheel() -> None:
    from setuptools import find_packages

    find = _pyproject()["tool"]["setuptools"]["packages"]["find"]  # type: ignore[index]
    packages = find_packages(where=str(REPO), include=find["include"], exclude=find.get("exclude", ()))
    assert {p.split(".")[0] for p in packages} == {"store", "coordination", "compactor"}, packages
    assert {"store.cli", "store.demo"} <= set(packages)  # the subpackages come along


@pytest.mark.timeout(300)
def test_the_wheel_holds_no_benchmarks_package(tmp_path: Path) -> None:
    """Build the wheel from a copy of the sources and read its file list."""
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((REPO / name).read_bytes())
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.egg-info")
    for name in ("store", "coordination", "compactor", "benchmarks"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=280)
    if proc.returncode != 0 and any(s in proc.stderr for s in ("NewConnectionError", "No matching distribution",
                                                              "Could not find a version")):
        pytest.skip(f"no package index to build with: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("sessionstore-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"store", "coordination", "compactor"}, sorted(top)
    assert "store/cli/__init__.py" in names and "compactor/purge.py" in names


def test_python_m_benchmarks_works_from_a_checkout() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "python -m benchmarks" in proc.stdout, proc.stderr
