"""Run llama.cpp's ``llama-server`` as a speculative or a baseline engine: for the real-engine
tests (tests/real), the real-engine bench and ``scripts/real-engine/serve.sh``.

The binary and the model pair come from ``scripts/real-engine/build.sh``, which prints them as
``SPEC_ROUTER_LLAMA_SERVER`` and ``SPEC_ROUTER_REAL_MODELS``. Each server is pinned to one core
(``taskset``) and uses one thread, with 16 slots of 512 tokens. In this llama.cpp a draft model
alone does not turn speculation on: ``--spec-type draft-simple`` does. Both serve the model as
``MODEL``, so clients need not care where they land. Processes are stopped by their PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "spec-test"
SLOTS = 16
DRAFT_MAX = 8
START_TIMEOUT = 120.0


class EngineNotFound(RuntimeError):
    """The build is missing: run ``scripts/real-engine/build.sh`` (``make test-real`` does)."""


@dataclass(frozen=True)
class Build:
    """Where ``scripts/real-engine/build.sh`` put the binary and the models."""

    server: Path
    models: Path

    @classmethod
    def from_env(cls) -> Build:
        server = os.environ.get("SPEC_ROUTER_LLAMA_SERVER")
        models = os.environ.get("SPEC_ROUTER_REAL_MODELS")
        if not server or not models:
            raise EngineNotFound(
                "SPEC_ROUTER_LLAMA_SERVER and SPEC_ROUTER_REAL_MODELS are not set: run "
                '`make test-real`, or `eval "$(scripts/real-engine/build.sh)"` first'
            )
        build = cls(Path(server), Path(models))
        for path in (build.server, build.models / "target.gguf", build.models / "draft.gguf"):
            if not path.exists():
                raise EngineNotFound(f"{path} does not exist: run scripts/real-engine/build.sh")
        return build


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def engine_args(build: Build, speculative: bool, port: int) -> list[str]:
    args = [str(build.server), "-m", str(build.models / "target.gguf")]
    if speculative:
        args += ["--model-draft", str(build.models / "draft.gguf"), "--spec-type", "draft-simple"]
        args += ["--spec-draft-n-max", str(DRAFT_MAX), "-td", "1"]
    args += ["-t", "1", "-tb", "1", "-np", str(SLOTS), "-c", str(SLOTS * 512), "--metrics"]
    return [*args, "--alias", MODEL, "--host", "127.0.0.1", "--port", str(port)]


@dataclass
class LlamaServer:
    """One ``llama-server``; ``start`` again after ``kill`` brings it back on the same port."""

    build: Build
    speculative: bool
    core: int | None
    log_dir: Path
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return "speculative" if self.speculative else "baseline"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / f"llama-server-{self.name}-{self.port}.log"

    def start(self, wait: bool = True) -> None:
        prefix = ["taskset", "-c", str(self.core)] if self.core is not None else []
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [*prefix, *engine_args(self.build, self.speculative, self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until ``/health`` answers 200; it answers 503 "Loading model" while it loads."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is None or self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} llama-server exited:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} llama-server not ready after {timeout} s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL: an abrupt crash."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def cores() -> tuple[int | None, int | None]:
    """A core each for the two servers when ``taskset`` and two cores are there."""
    usable = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") is None or len(usable) < 2:
        return None, None
    return usable[0], usable[1]


def main(argv: list[str] | None = None) -> int:
    """Both servers in the foreground until Ctrl-C (``make real-engine``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m router.tools.llamacpp", description=__doc__)
    parser.add_argument("--speculative-port", type=int, default=30001)
    parser.add_argument("--baseline-port", type=int, default=30002)
    parser.add_argument("--logs", type=Path, default=Path("out/real-engine"))
    args = parser.parse_args(argv)
    build = Build.from_env()
    spec_core, base_core = cores()
    spec = LlamaServer(build, True, spec_core, args.logs, port=args.speculative_port)
    base = LlamaServer(build, False, base_core, args.logs, port=args.baseline_port)
    try:
        spec.start()
        base.start()
        for server, core in ((spec, spec_core), (base, base_core)):
            pinned = "" if core is None else f", core {core}"
            print(f"{server.name:<11} {server.url}  (model {MODEL}{pinned}; log {server.log})")
        print("both ready; Ctrl-C stops them", flush=True)
        while spec.popen is not None and spec.popen.poll() is None:
            time.sleep(0.5)
        print(f"the speculative server exited:\n{spec.tail()}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        spec.stop()
        base.stop()


if __name__ == "__main__":
    raise SystemExit(main())
