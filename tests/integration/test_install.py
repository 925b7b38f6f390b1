"""Non-editable installs, each into a clean venv with the pinned dependencies, run from a
folder that is not this checkout: the product's wheel (built from what the image copies)
holds only the product and runs a processor alone; with the bench's wheel beside it the
demo runs from anywhere; the worker's wheel runs a worker beside the product."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile's build stage copies: the wheel must need nothing else.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "stream", "examples")
BENCH = ROOT / "packages" / "bench"
# What a module of the bench would be named inside the product's wheel, had it leaked in.
BENCH_IN_PRODUCT = (
    "instanced_stream/harness/",
    "instanced_stream/testing/",
    "instanced_stream_bench",
)
ITEMS = [
    {"_instance": "c-1", "text": "Thanks, this guide helped me a lot."},
    {"_instance": "c-2", "text": "You are an idiot and everyone hates you."},
    {"_instance": "c-3", "text": "BUY NOW cheap watches at my shop!!!"},
]


def _run(
    *argv: str | Path, cwd: Path, timeout: float = 300, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "OPENAI_"))}
    env |= env_extra or {}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(*argv: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = _run(*argv, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def build_wheel(sources: tuple[str, ...], project: Path, tmp: Path) -> Path:
    """A wheel built from a copy of `sources` (so nothing is written into the checkout)."""
    tree = tmp / "src"
    for name in sources:
        source = project / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            tree.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    out = tmp / "wheels"
    _ok(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, tree, cwd=tmp)
    (wheel,) = out.glob("*.whl")
    return wheel


def clean_venv(wheel: Path, tmp: Path) -> Path:
    """A new venv with `wheel` and its declared dependencies, pinned by constraints.txt
    (pip's cache serves what ./dev already downloaded)."""
    venv = tmp / "venv"
    _ok(sys.executable, "-m", "venv", venv, cwd=tmp)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    _ok(*pip, "-c", ROOT / "constraints.txt", wheel, cwd=tmp)
    return venv


@pytest.fixture(scope="module")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(SOURCES, ROOT, tmp_path_factory.mktemp("product"))


@pytest.fixture(scope="module")
def bench_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(("pyproject.toml", "setup.py", "src"), BENCH, tmp_path_factory.mktemp("b"))


def _audit(stream: Path, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [stream, "audit", "--json"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    report: dict[str, Any] = orjson.loads(done.stdout)
    return report


def test_the_product_wheel_holds_only_the_product_and_runs_a_processor_alone(
    bootstrap: str, simulator: tuple[object, str], product_wheel: Path, tmp_path: Path
) -> None:
    """What a deployment installs: no module of the harness or the test support, no bench
    command; `stream process` from that wheel alone decides items on a real broker (the
    model here is the test session's simulator, reached over HTTP as any endpoint)."""
    shipped = sorted(zipfile.ZipFile(product_wheel).namelist())
    assert "instanced_stream/runtime/service.py" in shipped  # the precondition
    leaked = [n for n in shipped if n.startswith(BENCH_IN_PRODUCT) or n.endswith("/local.py")]
    assert not leaked, leaked
    print(f"the product's wheel: {len(shipped)} files")

    venv = clean_venv(product_wheel, tmp_path)
    stream = venv / "bin" / "stream"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    absent = _run(venv / "bin" / "python", "-c", "import instanced_stream_bench", cwd=elsewhere)
    assert absent.returncode != 0
    for command in ("demo", "bench", "broker", "llm-sim"):
        done = _run(stream, command, "--items", "3", cwd=elsewhere)
        assert done.returncode == 2, done
        (line,) = done.stderr.strip().splitlines()
        assert "comes with the development distribution (instanced-stream-bench)" in line

    items = elsewhere / "items.jsonl"
    items.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in ITEMS))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "VIRTUAL_ENV"))}
    env |= {
        "STREAM_BOOTSTRAP_SERVERS": bootstrap,
        "STREAM_TOPIC_PREFIX": f"wheel{secrets.token_hex(3)}.",
        "STREAM_LLM_BASE_URL": simulator[1],
        "STREAM_WEB_PORT": "0",
    }
    # nor can a deployment arm a fault point: the injector is the bench's
    armed = _run(
        stream, "process", cwd=elsewhere, env_extra={**env, "STREAM_CRASH_AT": "after_llm:1"}
    )
    assert armed.returncode == 2, armed
    assert "no fault injector is installed" in armed.stderr, armed.stderr
    created = subprocess.run(
        [stream, "topics", "--create"], env=env, cwd=elsewhere, capture_output=True, timeout=120
    )
    assert created.returncode == 0, created.stderr
    processor = subprocess.Popen(
        [stream, "process"],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        produced = subprocess.run(
            [stream, "produce", items], env=env, cwd=elsewhere, capture_output=True, timeout=60
        )
        assert produced.returncode == 0, produced.stderr
        report: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert processor.poll() is None, processor.stdout.read() if processor.stdout else ""
            report = _audit(stream, env, elsewhere)
            if report["inputs"] == len(ITEMS) and not report["missing"]:
                break
            time.sleep(1)
    finally:
        processor.send_signal(signal.SIGTERM)
        output = processor.communicate(timeout=60)[0]
    assert report["inputs"] == len(ITEMS) and report["accounted"] == len(ITEMS), (report, output)
    assert not report["missing"] and not report["unexpected"], report
    assert processor.returncode == 0, output[-2000:]


def test_the_bench_beside_the_product_runs_the_demo_from_anywhere(
    product_wheel: Path, bench_wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _ok(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    _ok(*pip, "-c", ROOT / "constraints.txt", product_wheel, bench_wheel, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _ok(
        venv / "bin" / "python",
        "-c",
        "import instanced_stream, instanced_stream_bench as b; print(instanced_stream.__file__)",
        cwd=elsewhere,
    ).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout's

    missing = _run(venv / "bin" / "stream", "demo", "--example", "nope", cwd=elsewhere)
    assert missing.returncode == 2
    assert missing.stderr.startswith("stream: error: no example named 'nope'; there are: ")
    assert "moderation" in missing.stderr and "tickets" in missing.stderr

    demo = _run(venv / "bin" / "stream", "demo", "--items", "20", "--json", cwd=elsewhere)
    assert demo.returncode == 0, demo.stderr[-2000:]
    report = orjson.loads(demo.stdout.strip().splitlines()[-1])
    assert report["items"] == 20 and report["unaccounted"] == 0, report
    assert report["example"] == "moderation" and report["dead_letters"] == 4
    assert not list(elsewhere.iterdir()) or all(p.name.startswith(".") for p in elsewhere.iterdir())


def test_the_bench_wheel_ships_the_maven_projects_the_local_broker_and_registry_build(
    bench_wheel: Path,
) -> None:
    """testing/kafka (the broker's pom) and testing/apicurio (the schema registry's pom, its
    Java sources and resources, in Maven's layout) are package data of the bench: the
    launchers build from them where the installed package has them, so every file is in
    its wheel."""
    src = BENCH / "src"
    testing = src / "instanced_stream_bench" / "testing"
    wanted = {
        str(path.relative_to(src))
        for project in (testing / "kafka", testing / "apicurio")
        for path in project.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert "instanced_stream_bench/testing/apicurio/pom.xml" in wanted  # the precondition
    shipped = set(zipfile.ZipFile(bench_wheel).namelist())
    assert wanted <= shipped, sorted(wanted - shipped)


HANDLERS = """
from pathlib import Path

from instanced_stream_worker.activities import Activities

activities = Activities()


@activities.activity("moderateComment")
async def moderate(call, tool, context):
    with open(Path(__file__).with_name("handled.txt"), "a") as out:
        out.write(call.instance + "\\n")
"""


def _activity_record(i: int) -> bytes:
    return orjson.dumps(
        {
            "call_id": f"items/0/{i}/moderateComment/0",
            "tool": "moderateComment",
            "instance": f"c-{i}",
            "call": {"_tool": "moderateComment", "_instance": f"c-{i}", "decision": "approve"},
            "source": {"topic": "items", "partition": 0, "offset": i},
            "batch": {"id": "b", "size": 3, "token": "①", "attempt": 1},
            "model": "m",
        }
    )


def _files(venv: Path, distribution: str) -> set[str]:
    listed = _ok(
        venv / "bin" / "python", "-m", "pip", "show", "-f", distribution, cwd=venv
    ).stdout.split("Files:", 1)[1]
    return {line.strip() for line in listed.splitlines() if line.strip()}


async def _publish_calls(bootstrap: str, topic: str, n: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, _activity_record(i), key=f"c-{i}".encode())
    finally:
        await producer.stop()


def test_the_worker_package_runs_a_worker_and_sits_beside_the_product(
    bootstrap: str, product_wheel: Path, tmp_path: Path
) -> None:
    """`python -m build packages/activities` writes nothing into the checkout; its wheel
    in a clean venv runs a worker, refuses the processor's commands in one line, and
    installs beside the product without sharing a module with it."""
    before = set(ROOT.iterdir())
    out = tmp_path / "dist"
    _ok(sys.executable, "-m", "build", "-o", out, ROOT / "packages" / "activities", cwd=tmp_path)
    # nothing new at the root (no egg-info, no build/): only its generated copy, ignored
    assert set(ROOT.iterdir()) == before, set(ROOT.iterdir()) - before
    generated = ROOT / "packages" / "activities" / "src"
    ignored = _ok("git", "check-ignore", generated, cwd=ROOT)
    assert ignored.stdout.strip(), "the generated copy must be ignored by git"
    (thin,) = out.glob("*.whl")
    assert len(list(out.glob("*.tar.gz"))) == 1
    # the worker, its command and what they import: no processor, harness, operator
    # command, test support or the product's CLI
    shipped = [n for n in zipfile.ZipFile(thin).namelist() if n.endswith(".py")]
    assert "instanced_stream_worker/activities/worker.py" in shipped, shipped
    heavy = ("runtime/", "harness/", "ops/", "testing/", "cli/main.py")
    pulled = [n for n in shipped if n.removeprefix("instanced_stream_worker/").startswith(heavy)]
    assert not pulled, pulled

    worker_venv = tmp_path / "worker"
    worker_venv.mkdir()
    venv = clean_venv(thin, worker_venv)
    stream = venv / "bin" / "stream"
    imported = _run(
        venv / "bin" / "python", "-c", "import faust, openai", cwd=worker_venv
    )  # the processor's dependencies are not there
    assert imported.returncode != 0, "the worker venv has faust or openai"
    for command in ("process", "check", "demo"):
        done = _run(stream, command, cwd=worker_venv)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "not installed in the worker package" in lines[0], lines

    # a worker with its handlers only (--no-spec) handles calls from a real broker
    prefix = f"thin{secrets.token_hex(3)}."
    topic = f"{prefix}activity.moderateComment"
    asyncio.run(_publish_calls(bootstrap, topic, 3))
    module = worker_venv / "handlers.py"
    module.write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "VIRTUAL_ENV"))}
    env |= {"STREAM_BOOTSTRAP_SERVERS": bootstrap, "STREAM_TOPIC_PREFIX": prefix}
    env["STREAM_WORKER_WEB_PORT"] = "0"
    worker = subprocess.Popen(
        [stream, "activities", module, "--no-spec", "--group", f"{prefix}team"],
        cwd=worker_venv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    handled = worker_venv / "handled.txt"
    try:
        for _ in range(600):
            if handled.exists() and len(handled.read_text().split()) >= 3:
                break
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0]
    assert sorted(handled.read_text().split()) == ["c-0", "c-1", "c-2"], output
    assert worker.returncode == 0, output

    # beside the product: no file in common but the `stream` script, which is the product's
    # --no-deps: the files and imports are the point here, the demo test installs its deps
    _ok(
        venv / "bin" / "python",
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        product_wheel,
        cwd=tmp_path,
    )
    shared = _files(venv, "instanced-stream") & _files(venv, "instanced-stream-activities")
    assert {Path(f).name for f in shared} <= {"stream"}, shared
    both = _run(
        venv / "bin" / "python",
        "-c",
        "import instanced_stream.cli.main, instanced_stream_worker.activities.worker",
        cwd=worker_venv,
    )
    assert both.returncode == 0, both.stderr
    # the worker's `stream`, should it be the one on PATH, hands over to the product's
    delegated = _run(
        venv / "bin" / "python",
        "-c",
        "from instanced_stream_worker.cli.activities import main; main(['process', '--help'])",
        cwd=worker_venv,
    )
    assert delegated.returncode == 0 and "usage: stream process" in delegated.stdout
