"""The viewer reads only inside its run folder, and never writes to it."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

SECRET = "top secret outside the run folder"


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and folder under ``root``: size, modification time, content hash."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return found


@pytest.fixture
def guarded(tmp_path: Path, token_run: Path) -> Path:
    """A copy of a token run with links that lead out of it, and a secret beside it."""
    run = tmp_path / "run"
    shutil.copytree(token_run, run)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    (tmp_path / "outside-episode").mkdir()
    (tmp_path / "outside-episode" / "log.txt").write_text(SECRET)
    episode = run / "episodes" / "count-vowels" / "0"
    (episode / "log.txt").unlink()
    (episode / "log.txt").symlink_to(secret)
    # A whole episode folder that is a link to a folder outside.
    linked = run / "episodes" / "clamp-order" / "0"
    shutil.rmtree(linked)
    linked.symlink_to(tmp_path / "outside-episode", target_is_directory=True)
    return run


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/runs/0/episode", {"key": "../secret.txt"}),
        ("/api/runs/0/episode", {"key": "episodes/../../secret.txt"}),
        (
            "/api/runs/0/episode/log",
            {"key": "episodes/mean-empty/0", "name": "../../../../secret.txt"},
        ),
        ("/api/runs/0/episode/log", {"key": "episodes/mean-empty/0", "name": "/etc/passwd"}),
        ("/api/runs/0/episode/log", {"key": "/etc", "name": "passwd"}),
        ("/api/runs/0/episode/log", {"key": "episodes/count-vowels/0", "name": "log.txt"}),
        ("/api/runs/0/episode/log", {"key": "episodes/clamp-order/0", "name": "log.txt"}),
        ("/api/runs/0/episode", {"key": "episodes/clamp-order/0"}),
        ("/static/../../secret.txt", {}),
        ("/static/%2e%2e/%2e%2e/%2e%2e/secret.txt", {}),
        ("/static/..%2f..%2f..%2fsecret.txt", {}),
    ],
)
def test_paths_outside_the_run_folder_are_refused(viewer_of, guarded, path, params):
    viewer = viewer_of(str(guarded))
    response = viewer.get(path, **params)
    assert response.status_code in (400, 403, 404), response.text
    assert SECRET not in response.text


def test_a_link_out_of_the_run_folder_is_forbidden_and_not_listed(viewer_of, guarded):
    viewer = viewer_of(str(guarded))
    response = viewer.get("/api/runs/0/episode/log", key="episodes/count-vowels/0", name="log.txt")
    assert response.status_code == 403 and "outside the run folder" in response.json()["error"]
    episode = viewer.json("/api/runs/0/episode", key="episodes/count-vowels/0")
    assert "log.txt" not in {f["name"] for f in episode["files"]}
    assert viewer.get("/api/runs/0/episode", key="episodes/clamp-order/0").status_code == 403


def test_only_reading_methods_exist(viewer):
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = httpx.request(method, viewer.url + "api/runs/0/episodes", timeout=30)
        assert response.status_code == 405, method


def test_a_foreign_host_name_is_refused(viewer):
    """A page on another site cannot read the runs by rebinding its name to 127.0.0.1."""
    response = httpx.get(viewer.url + "api/runs", headers={"Host": "evil.example"}, timeout=30)
    assert response.status_code == 400
    assert httpx.get(viewer.url + "api/runs", timeout=30).status_code == 200


def test_the_server_listens_on_loopback_by_default(viewer):
    host = httpx.URL(viewer.url).host
    assert host == "127.0.0.1"
    other = [a for a in _addresses() if not a.startswith("127.")]
    port = httpx.URL(viewer.url).port
    for address in other:  # the same port on this machine's other addresses is closed
        with socket.socket() as sock:
            sock.settimeout(5)
            assert sock.connect_ex((address, port)) != 0, address


def _addresses() -> list[str]:
    try:
        return sorted(
            {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        )
    except OSError:
        return []


def test_viewing_every_page_writes_nothing_into_the_run_folder(viewer_of, token_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(token_run, run)
    before = snapshot(run)
    viewer = viewer_of(str(run))
    rows = viewer.json("/api/runs/0/episodes", limit=100)["rows"]
    viewer.json("/api/runs")
    viewer.json("/api/runs/0/summary")
    for row in rows:
        key = row["key"]
        viewer.json("/api/runs/0/episode", key=key)
        viewer.json("/api/runs/0/episode/tokens", key=key)
        viewer.json("/api/runs/0/episode/exactness", key=key)
        viewer.json("/api/runs/0/episode/log", key=key)
    with httpx.stream("GET", viewer.url + "api/runs/0/events", timeout=30) as events:
        for line in events.iter_lines():
            if line.startswith("data:"):
                break
    assert viewer.get("/").status_code == 200
    assert snapshot(run) == before


def test_a_missing_folder_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "view", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "nope is not a folder" in proc.stderr


def test_a_port_in_use_is_a_clear_error(viewer, messages_run):
    port = str(httpx.URL(viewer.url).port)
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "view", str(messages_run), "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in proc.stderr


def test_a_loopback_address_given_with_host_is_answered(viewer_of, messages_run):
    viewer = viewer_of(str(messages_run), "--host", "127.0.0.2")
    assert httpx.URL(viewer.url).host == "127.0.0.2"
    assert viewer.get("/api/runs").status_code == 200  # Host: 127.0.0.2:PORT
    for name in ("localhost", "127.0.0.1"):
        response = httpx.get(viewer.url + "api/runs", headers={"Host": name}, timeout=30)
        assert response.status_code == 200, name
    response = httpx.get(viewer.url + "api/runs", headers={"Host": "evil.example"}, timeout=30)
    assert response.status_code == 400 and "Invalid host header" in response.text


def test_a_shared_address_is_answered_by_address_and_name_but_not_for_other_names(
    messages_run,
):
    """Bound to a LAN address (192.0.2.10 stands for one; the app is driven in process)."""
    from starlette.testclient import TestClient

    from uniagent.view.app import create_app
    from uniagent.view.rundir import RunFolder

    app = create_app([RunFolder(messages_run)], host="192.0.2.10")
    with TestClient(app, base_url="http://192.0.2.10:8765") as client:
        assert client.get("/api/runs").status_code == 200
        for host in (socket.gethostname(), "localhost:8765", "[2001:db8::1]:8765"):
            assert client.get("/api/runs", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8765", "192.0.2.10.evil.example", ""):
            assert client.get("/api/runs", headers={"Host": host}).status_code == 400, host


@pytest.mark.parametrize(
    ("header", "answered"),
    [
        ("127.0.0.1:8765", True),
        ("127.0.0.2", True),
        ("[::1]:8765", True),
        ("::1", True),
        ("LOCALHOST:80", True),
        ("localhost.", True),
        ("10.1.2.3:8765", True),  # an address: a rebinding page always sends its name
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("127.0.0.1:port", False),
        ("[::1", False),
        ("", False),
    ],
)
def test_the_host_check(header, answered):
    from uniagent.view.security import host_allowed, host_names

    assert host_allowed(header, host_names("127.0.0.1")) is answered


def test_the_host_names_follow_the_address_bound_to():
    from uniagent.view.security import host_names

    assert host_names("127.0.0.1") == {"localhost"}
    assert host_names("viewer.example") >= {"localhost", "viewer.example"}
    shared = host_names("0.0.0.0")
    assert socket.gethostname().lower() in shared and "0.0.0.0" not in shared


def test_every_response_has_a_content_security_policy_without_inline_script(viewer):
    for path in ("/", "/static/js/app.js", "/api/runs", "/api/runs/9/episodes"):
        response = viewer.get(path)
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy, path
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in viewer.get("/").text, "no inline script in the page"
