"""Several servers of one model in one run (``--model A --model B``, ``--model @FILE``): each
episode on one server, least-loaded first; a server that fails is taken out until its
health check passes, its episodes retried elsewhere as infrastructure, never scored 0; the
summary shows each server's share. The servers are real HTTP servers on 127.0.0.1, the one
killed mid-run a separate process."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from uniagent.env.aio import wait_for
from uniagent.errors import ConfigError
from uniagent.models import ModelError, OpenAIChatModel
from uniagent.models.pool import ModelPool
from uniagent.models.spec import pool_from_specs, read_model_specs
from uniagent.testing import Reply, ScriptedChatServer, cli, tool_call

FINISH = Reply("Done.", tool_calls=[tool_call("done", {}, "call_done")])  # conftest's done


def test_model_specs_come_from_the_options_and_files(tmp_path: Path) -> None:
    listed = tmp_path / "servers.txt"
    listed.write_text(
        "# two servers\nopenai:http://a:8000/v1#m\n\nopenai:http://b:8000/v1#m  # b\n"
    )
    assert read_model_specs(["hf:smollm2"]) == ["hf:smollm2"]
    assert read_model_specs([f"@{listed}", "openai:http://c:8000/v1#m"]) == [
        "openai:http://a:8000/v1#m",
        "openai:http://b:8000/v1#m",
        "openai:http://c:8000/v1#m",
    ]
    with pytest.raises(ConfigError, match="must all be openai: endpoints"):
        read_model_specs(["hf:smollm2", "openai:http://a:8000/v1#m"])
    with pytest.raises(ConfigError, match="names the same server twice"):
        read_model_specs(["openai:http://a:8000/v1#m", "openai:http://a:8000/v1#m"])
    with pytest.raises(ConfigError, match="cannot read it"):
        read_model_specs([f"@{tmp_path / 'missing.txt'}"])
    with pytest.raises(ConfigError, match="their \\?tokenizer= differ"):
        pool_from_specs(["openai:http://a:8000/v1#m?tokenizer=x", "openai:http://b:8000/v1#m"])


async def test_an_episode_goes_to_the_least_loaded_server_and_stays_there() -> None:
    pool = ModelPool([OpenAIChatModel(f"http://127.0.0.1:{p}/v1", "m") for p in (1, 2)])
    a, b = pool.servers
    async with pool.lease() as (first, model_1), pool.lease() as (second, _):
        assert (first, second) == (a, b) and (a.in_flight, b.in_flight) == (1, 1)
        # Each episode has its own copy (its own token count) on its server's client.
        assert model_1 is not a.model and model_1.client is a.model.client
        async with pool.lease() as (third, _):
            assert third is a  # as many in flight and so far on each: the first named
            async with pool.lease() as (fourth, _):
                assert fourth is b  # fewer in flight
        async with pool.lease() as (fifth, _):
            assert fifth is a  # as many in flight (1 each): fewer so far (2 against 3)
    assert (a.in_flight, b.in_flight) == (0, 0) and (a.episodes, b.episodes) == (3, 2)
    async with pool.lease() as (sixth, _):
        assert sixth is b  # none in flight: the one with fewer episodes
    await pool.aclose()


async def test_a_failed_server_is_out_until_its_health_check_passes() -> None:
    with ScriptedChatServer(models_status=503) as one, ScriptedChatServer(models_status=503) as two:
        pool = ModelPool(
            [OpenAIChatModel(s.base_url, "m", max_retries=0) for s in (one, two)],
            health_interval=0.01,
            wait_for_server=0.01,
        )
        a, b = pool.servers
        pool.failed(a, "it stopped answering")
        for _ in range(3):
            async with pool.lease() as (server, _):
                assert server is b
        pool.failed(b, "it failed too")
        with pytest.raises(ModelError, match="every model server is out"):
            async with pool.lease():
                pass
        one.models_status = 200  # it answers again: its health check puts it back

        async def back() -> None:
            changed = pool._condition()
            async with changed:
                while not a.up:
                    await changed.wait()

        await wait_for(back(), 60)
        async with pool.lease() as (server, _):
            assert server is a
        assert pool.shares()[a.name] == {"episodes": 1, "up": True, "failures": 1}
        assert pool.shares()[b.name] == {"episodes": 3, "up": False, "failures": 1}
        await pool.aclose()


SERVER = textwrap.dedent(
    """
    import sys, threading
    from uniagent.testing import Reply, ScriptedChatServer, tool_call

    def hold(body):  # answers nothing: the test kills this process while it waits
        print("held", flush=True)
        threading.Event().wait()

    with ScriptedChatServer(default=hold) as server:
        print(server.base_url, flush=True)
        threading.Event().wait()
    """
)


def test_a_server_killed_mid_run_loses_no_episode(
    done_run_files, tmp_path: Path, monkeypatch
) -> None:
    """Two servers; the first holds its first episode's request and is then killed: that
    episode is retried on the other (infrastructure, not scored), every episode ends
    ``finished``, and the summary shows each server's share."""
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    config, data = done_run_files(5)
    doomed = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "out"
    try:
        assert doomed.stdout is not None
        doomed_url = doomed.stdout.readline().strip()
        assert doomed_url.startswith("http://127.0.0.1:"), doomed_url
        with ScriptedChatServer(default=lambda body: FINISH) as well:
            well_url = well.base_url
            servers = tmp_path / "servers.txt"
            servers.write_text(f"openai:{doomed_url}#m\nopenai:{well_url}#m\n")
            argv = ["run", str(config), "--data", str(data), "--out", str(out), "--model",
                    f"@{servers}", "--concurrency", "2", "--retry-delay", "0"]  # fmt: skip
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                running = pool.submit(cli, argv)
                assert doomed.stdout.readline().strip() == "held"  # an episode waits on it
                doomed.send_signal(signal.SIGKILL)
                status = running.result(timeout=600)
    finally:
        doomed.kill()
        doomed.wait()
    assert status == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    final = {r["task_id"]: r for r in records}
    assert sorted(final) == [f"t{i}" for i in range(5)]
    assert all(r["exit_reason"] == "finished" and not r["traj_masked"] for r in final.values())
    # The episode that waited on the killed server (the first to lease one: which of the
    # two started first is the scheduler's choice) was retried once, on the other.
    (retried,) = [r for r in final.values() if r.get("previous_attempts")]
    (lost,) = retried["previous_attempts"]
    assert lost["exit_reason"] == "model_error" and lost["model_server"] == doomed_url
    assert retried["model_server"]["name"] == well_url
    summary = json.loads((out / "summary.json").read_text())
    assert summary["servers"] == {
        doomed_url: {"episodes": 0, "generated_tokens": 0, "failed_attempts": 1},
        well_url: {"episodes": 5, "generated_tokens": 5, "failed_attempts": 0},
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["servers"] == [f"openai:{doomed_url}#m", f"openai:{well_url}#m"]
