"""`uniagent view` without its extra: a clear instruction, not a traceback (the core suite
runs without starlette; the viewer's own tests are in view/)."""

from __future__ import annotations

import sys

import pytest

from uniagent.cli import main


def test_view_without_its_extra_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed
    assert main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "uniagent view needs its web server" in err and "pip install 'uniagent[view]'" in err


@pytest.mark.parametrize("argv", [["view"], ["view", "--port", "x", "."]])
def test_view_arguments_are_checked(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
