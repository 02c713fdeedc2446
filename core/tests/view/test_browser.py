"""End to end in headless Chromium: the runs table, filters, an episode, the token view,
the summary, the comparison, and live updates while `uniagent run` is going.

Every wait is Playwright's own (it polls the DOM until the expectation holds): nothing
sleeps, so a busy machine only makes the tests slower, not flaky.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from urllib.parse import quote

import view_runs
from playwright.sync_api import expect

from uniagent.testing import ScriptedChatServer


def episode_url(viewer, run: int, key: str, tab: str = "") -> str:
    return f"{viewer.url}#/r/{run}/e?key={quote(key, safe='')}" + (f"&tab={tab}" if tab else "")


def test_the_runs_table_filters_and_opens_an_episode(viewer, page, screenshot):
    page.goto(viewer.url)
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(12)
    expect(page.locator("#live")).to_have_attribute("data-state", "finished")
    screenshot("runs-table")

    page.select_option("#filter-exit", "format_error")
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_attribute("data-key", "episodes/factorial-zero/0")
    assert "exit=format_error" in page.url
    page.get_by_role("button", name="Clear filters").click()
    expect(rows).to_have_count(12)

    page.fill("#filter-q", "mean")
    expect(rows).to_have_count(2)
    page.select_option("#filter-reward", "solved")
    expect(page.locator("#page-range")).to_have_text("1–2 of 2")

    page.get_by_role("button", name="Reward").click()  # sort by reward, highest first
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Reward ▼")

    page.get_by_role("link", name="mean-empty").first.click()
    expect(page.locator("#episode-title")).to_contain_text("mean-empty")
    expect(page.locator("#conversation .msg-assistant")).to_have_count(4)
    # The editor's replacement reads as a diff; the shell command as a command.
    expect(page.locator("#conversation .dl-add").first).to_contain_text("if not values:")
    expect(page.locator("#conversation pre.shell").first).to_have_text("pwd && cat stats.py")
    screenshot("episode", full_page=True)

    page.click("#tab-result")
    expect(page.locator("#submission .dl-add").first).to_contain_text("if not values:")
    expect(page.locator("#reward-info")).to_contain_text("Ran 2 tests")
    page.click("#tab-log")
    expect(page.locator("#log-text")).to_contain_text("finished: finished reward=1.0")


def test_long_outputs_are_folded_until_asked_for(viewer, page, screenshot):
    page.goto(episode_url(viewer, 0, "episodes/clamp-order/0"))
    observation = page.locator("#conversation .msg-tool").first
    expect(observation.locator("pre")).not_to_contain_text("400")
    observation.get_by_role("button", name="more lines").click()
    expect(observation.locator("pre")).to_contain_text("399\n400")
    screenshot("unfolded", docs=False)


def test_the_token_view_shows_whose_tokens_and_their_log_probs(viewer, page, screenshot):
    page.goto(episode_url(viewer, 1, "episodes/mean-empty/0"))
    page.click("#tab-tokens")
    stream = page.locator("#token-stream")
    expect(stream.locator(".tok.k-model").first).to_be_visible()
    assert stream.locator(".tok.k-env").count() > 0
    assert stream.locator(".tok.k-prompt").count() == 0, "the prompt is folded away"
    expect(stream.locator(".turn-mark")).to_have_count(4)
    expect(page.locator("#exactness")).to_contain_text("Exactness ok")
    expect(page.locator("#exactness")).to_contain_text("the ids equal a fresh chat-template render")

    token = stream.locator(".tok.k-model", has_text="Step").first
    token.hover()
    tooltip = page.locator("#tooltip")
    expect(tooltip).to_be_visible()
    expect(tooltip).to_contain_text("model (mask 1)")
    expect(tooltip).to_contain_text("log-prob -")
    screenshot("tokens")

    page.click("#colour-logprob")
    expect(page.locator("#token-view")).to_have_class("token-view colour-logprob")
    screenshot("tokens-logprob")
    page.click("#colour-mask")
    expect(page.locator("#token-view")).to_have_class("token-view colour-mask")

    page.locator(".prompt-tokens > summary").click()
    expect(page.locator("#prompt-tokens .tok.k-prompt").first).to_contain_text("<|im_start|>")


TOKENS_API = "**/episode/tokens?*"


def test_the_token_view_says_it_is_loading_until_its_tokens_arrive(viewer, page):
    # The first request loads the tokenizer on the server (seconds): the browser holds
    # every tokens request here until the test has seen the loading sign.
    held, released = [], []

    def hold(route):
        if released:
            route.continue_()
        else:
            held.append(route)

    page.route(TOKENS_API, hold)
    page.goto(episode_url(viewer, 1, "episodes/mean-empty/0", "tokens"))
    loading = page.locator("#tokens-loading")
    expect(loading).to_be_visible()
    expect(loading).to_contain_text("Loading the tokens")
    assert page.locator("#token-view").count() == 0

    released.append(True)
    while held:
        held.pop().continue_()
    expect(page.locator("#token-stream .tok.k-model").first).to_be_visible()
    expect(loading).to_have_count(0)


def test_opening_an_episode_starts_loading_its_tokens_in_the_background(viewer, page):
    # So the tokenizer is loaded by the time the Tokens tab is clicked.
    with page.expect_request(TOKENS_API) as request:
        page.goto(episode_url(viewer, 1, "episodes/mean-empty/0"))
    assert "limit=1" in request.value.url
    expect(page.locator("#conversation .msg-assistant").first).to_be_visible()
    assert page.locator("#tab-tokens").get_attribute("aria-selected") == "false"


def test_swe_test_statuses_are_listed_as_passing_and_failing(
    viewer_of, messages_run, tmp_path, page, screenshot
):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    result = run / "episodes" / "palindrome-case" / "0" / "result.json"
    record = json.loads(result.read_text())
    record["reward_info"] = {
        "resolution_status": "PARTIAL",
        "tests_status": {
            "FAIL_TO_PASS": {"success": ["tests/test_words.py::test_mixed_case"], "failure": []},
            "PASS_TO_PASS": {
                "success": ["tests/test_words.py::test_simple"],
                "failure": ["tests/test_words.py::test_not"],
            },
        },
        "status_mismatches": {"tests/test_words.py::test_not": {"expected": "PASSED"}},
    }
    result.write_text(json.dumps(record))
    viewer = viewer_of(str(run))
    page.goto(episode_url(viewer, 0, "episodes/palindrome-case/0", "result"))
    tests = page.locator("#tests-status")
    expect(tests.locator(".test-success")).to_have_count(2)
    expect(tests.locator(".test-failure")).to_have_text("✗tests/test_words.py::test_not")
    expect(tests).to_contain_text("PASS_TO_PASS 1/2 passing")
    expect(page.locator("#reward-info tr.warn")).to_contain_text("status_mismatches")
    screenshot("tests-status", docs=False)


def test_the_result_tab_shows_missing_values_as_dashes_never_as_null(
    viewer_of, messages_run, tmp_path, page
):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    result = run / "episodes" / "mean-empty" / "0" / "result.json"
    record = json.loads(result.read_text())
    record.update(
        reward=None, exit_reason=None, submission=None, error=None, metrics=None,
        reward_info=None, integrity={"history_scrub": {"removed": 2, "head": None}},
        turn_scores={"0": None, "1": 0.5},
    )  # fmt: skip
    result.write_text(json.dumps(record))
    # A folder the run started but never finished: no result at all (an interrupted row;
    # without the manifest, the episode folders are the plan).
    (run / "manifest.json").unlink()
    (run / "episodes" / "extra-task" / "0").mkdir(parents=True)
    viewer = viewer_of(str(run))

    page.goto(episode_url(viewer, 0, "episodes/mean-empty/0", "result"))
    body = page.locator("#tab-body")
    expect(page.locator("#reward-info")).to_contain_text("no other details")
    expect(body).to_contain_text("turn 1: –, turn 2: 0.5")
    expect(page.locator("#integrity")).to_contain_text('{"removed":2}')
    assert "null" not in body.inner_text()

    page.goto(episode_url(viewer, 0, "episodes/mean-empty/1", "result"))  # a full result
    expect(page.locator("#reward-info")).to_contain_text("Ran 2 tests")
    assert "null" not in body.inner_text()

    page.goto(episode_url(viewer, 0, "episodes/extra-task/0", "result"))
    expect(page.locator("#episode-head .badge-status-interrupted")).to_be_visible()
    expect(body).to_have_text("No result: the run stopped before this episode finished.")


def test_a_tampering_report_names_the_protected_file_the_agent_changed(viewer, page, screenshot):
    # The policy emptied tests/test_text.py; the grader restored it and scored 0.
    page.goto(viewer.url + "#/r/0?q=count-vowels")
    expect(page.locator("#runs-table tbody tr")).to_have_count(2)
    expect(page.locator("#runs-table .flag").first).to_have_text("tampered")
    page.goto(episode_url(viewer, 0, "episodes/count-vowels/0", "result"))
    expect(page.locator("#score-forced")).to_contain_text("Score forced: tampered")
    row = page.locator("#tampered tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("tests/test_text.py")
    expect(row).to_contain_text("modified")
    expect(page.locator("#integrity")).to_contain_text("protected files")
    page.locator("#integrity").scroll_into_view_if_needed()
    screenshot("tampering")


def test_a_messages_only_episode_explains_why_it_has_no_tokens(viewer, page, screenshot):
    page.goto(episode_url(viewer, 0, "episodes/fahrenheit/1", "tokens"))
    expect(page.locator("#tokens")).to_contain_text("messages only")
    screenshot("no-tokens", docs=False)


def test_the_summary_draws_its_charts(viewer, page, screenshot):
    page.goto(viewer.url + "#/r/0/summary")
    expect(page.locator("#exit-chart .hbar")).to_have_count(2)
    expect(page.locator("#tool-chart .hbar")).to_have_count(3)
    expect(page.locator("#turns-chart .vbar").first).to_be_visible()
    expect(page.locator("#summary")).to_contain_text("pass@2")
    expect(page.locator("#summary .stat-card.alarm")).to_contain_text("Tampered2")
    expect(page.locator("#time-chart .stack-part")).to_have_count(4)
    chart = page.locator("#integrity-chart")
    expect(chart).to_contain_text("2 of 12 graded episodes report tampering")
    expect(chart.locator(".hbar").first).to_contain_text("tampered: protected_file")
    expect(chart.locator(".vbar").first).to_be_visible()
    expect(chart).to_contain_text("class: task_files")
    per_class = chart.locator(".integrity-class[data-class=task_files]")
    expect(per_class).to_contain_text("Episodes showing task_files over the run")
    expect(per_class.locator(".vbar").first).to_be_visible()
    screenshot("summary")


def test_the_summary_shows_each_model_servers_share(messages_run, viewer_of, page, tmp_path):
    """A run on several model servers (``--model A --model B``): the summary's panel has a
    bar per server, with its tokens and the attempts lost there."""
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    a, b = "http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    for i, record in enumerate(records):
        record["model_server"] = {"name": a if i % 3 else b, "generated_tokens": 10}
    records[0]["previous_attempts"] = [{"attempt": 1, "exit_reason": "model_error",
                                        "model_server": a}]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    viewer = viewer_of(str(run))
    page.goto(viewer.url + "#/r/0/summary")
    chart = page.locator("#server-chart")
    expect(chart.locator(".hbar")).to_have_count(2)
    expect(chart).to_contain_text(f"{a}: 80 tokens, 1 attempts lost")
    expect(chart).to_contain_text(f"{b}: 40 tokens, 0 attempts lost")


def test_compare_two_runs_task_by_task(viewer, page, screenshot):
    page.goto(viewer.url + "#/compare?a=0&b=1")
    rows = page.locator("#compare-table tbody tr")
    expect(rows).to_have_count(6)
    expect(rows.first).to_have_attribute("data-change", "regressed")
    screenshot("compare")
    page.locator("#compare-chips [data-change=improved]").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-task", "palindrome-case")


def test_the_table_and_an_episode_update_live_while_the_run_goes_on(
    viewer_of, page, screenshot, tmp_path
):
    tasks = view_runs.make_tasks(tmp_path / "swe_tiny")
    config = view_runs.write_config(tmp_path / "config.yaml")
    out = tmp_path / "live"
    asked = threading.Event()
    gate = threading.Event()
    reply = view_runs.chat_policy(gate)

    def held(body):  # every model call waits until the test lets it through
        asked.set()
        return reply(body)

    with ScriptedChatServer(default=held) as server:
        command = view_runs.cli_command(config, tasks, server, out, "--concurrency", "2")
        run = subprocess.Popen(
            command,
            env=view_runs.run_env(tmp_path / "tmp"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert asked.wait(180), "the run never called the model"
            viewer = viewer_of(str(out))
            page.goto(viewer.url)
            table = page.locator("#runs-table tbody")
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            expect(table.locator("tr[data-status=running]")).to_have_count(2)
            expect(table.locator("tr[data-status=queued]")).to_have_count(4)
            page.evaluate("window.__samePage = true")
            screenshot("live-running")

            # A second tab on a running episode; the first stays on the table.
            key = table.locator("tr[data-status=running]").first.get_attribute("data-key")
            episode = page.context.new_page()
            episode.goto(f"{viewer.url}#/r/0/e?key={quote(key, safe='')}")
            head = episode.locator("#episode-head")
            expect(head.locator(".badge-status-running")).to_be_visible()
            expect(episode.locator("#tab-body")).to_contain_text("saved when the episode ends")
            episode.click("#tab-log")
            expect(episode.locator("#log-text")).to_contain_text(": start")

            gate.set()
            # Both tabs follow the run through its events, without reloading.
            expect(head.locator(".badge-status-finished")).to_be_visible(timeout=180_000)
            expect(episode.locator("#log-text")).to_contain_text("finished: ")
            episode.click("#tab-conversation")
            expect(episode.locator("#conversation .msg-assistant").first).to_be_visible()
            expect(table.locator("tr[data-status=finished]")).to_have_count(6, timeout=180_000)
            expect(page.locator("#live")).to_have_attribute("data-state", "finished")
            assert page.evaluate("window.__samePage") is True, "updated without a reload"
            screenshot("live-finished", docs=False)
        finally:
            gate.set()
            _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr


#: What a policy might put in its output to run script in the page.
XSS = '<script>alert(1)</script><img src=x onerror="window.__xss = 1; alert(2)">'


def test_html_in_an_episode_is_shown_as_text_and_never_runs(
    viewer_of, messages_run, tmp_path, page
):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    episode = run / "episodes" / "mean-empty" / "0"
    messages = json.loads((episode / "messages.json").read_text())
    tool = next(m for m in messages if m["role"] == "tool")
    tool["content"] = f"before {XSS} after"
    assistant = next(m for m in messages if m["role"] == "assistant")
    assistant["content"] += XSS
    (episode / "messages.json").write_text(json.dumps(messages))
    record = json.loads((episode / "result.json").read_text())
    record["error"] = XSS
    record["reward_info"] = {**record.get("reward_info", {}), "note": XSS}
    (episode / "result.json").write_text(json.dumps(record))
    with (episode / "log.txt").open("a") as handle:
        handle.write(XSS + "\n")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    injected = "#view script, #view img, #view [onerror]"

    viewer = viewer_of(str(run))
    page.goto(episode_url(viewer, 0, "episodes/mean-empty/0"))
    observation = page.locator("#conversation .msg-tool").first
    expect(observation).to_contain_text(f"before {XSS} after")
    expect(page.locator("#conversation .msg-assistant").first).to_contain_text("<script>alert(1)")
    assert page.locator(injected).count() == 0
    page.click("#tab-result")
    expect(page.locator("#tab-body .error").first).to_contain_text(XSS)
    expect(page.locator("#reward-info")).to_contain_text('onerror="window.__xss')
    assert page.locator(injected).count() == 0
    page.click("#tab-log")
    expect(page.locator("#log-text")).to_contain_text(XSS)
    assert page.locator(injected).count() == 0
    assert page.evaluate("window.__xss") is None and dialogs == []


def test_the_page_refuses_inline_script(viewer, browser):
    """The Content-Security-Policy is in force: a script element with inline code, as an
    injection would make one, is refused by the browser itself."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(viewer.url)
        expect(page.locator("#runs-table tbody tr")).to_have_count(12)
        violated = page.evaluate(
            """() => new Promise((resolve) => {
                document.addEventListener(
                    "securitypolicyviolation", (e) => resolve(e.effectiveDirective), {once: true});
                const script = document.createElement("script");
                script.textContent = "window.__inline = 1";
                document.head.append(script);
            })"""
        )
        assert violated == "script-src-elem"
        assert page.evaluate("window.__inline") is None
    finally:
        context.close()


def test_calls_written_as_text_read_like_calls_made_through_the_api(
    viewer_of, text_run, page, screenshot
):
    viewer = viewer_of(str(text_run))
    page.goto(episode_url(viewer, 0, "episodes/fahrenheit/0"))
    first = page.locator("#conversation .msg-assistant").first
    expect(first.locator("pre.shell")).to_have_text(
        "sed -i 's/- 32/+ 32/' temperature.py && git diff"
    )
    expect(first.locator(".tool-call[data-source=text]")).to_contain_text("parsed from the text")
    expect(first.locator("pre.prose").first).to_have_text("Step 1: execute bash.")
    raw = first.locator("details.raw-text")
    expect(raw.locator("pre")).not_to_be_visible()  # what the model wrote, folded
    raw.locator("summary").click()
    expect(raw.locator("pre")).to_contain_text('<tool_call>\n{"name": "execute_bash"')
    output = page.locator("#conversation .msg-tool").first
    expect(output.locator(".role")).to_have_text("observation · execute_bash")
    expect(output).to_contain_text("+ 32")
    screenshot("episode-text-calls", full_page=True, docs=False)


def test_a_run_started_in_the_folder_of_runs_joins_the_page(
    viewer_of, messages_run, tmp_path, page
):
    runs = tmp_path / "runs"
    shutil.copytree(messages_run, runs / "old")
    (runs / "new").mkdir()  # made beforehand, empty
    viewer = viewer_of(str(runs))
    page.goto(viewer.url)
    expect(page.locator("#runs-table tbody tr")).to_have_count(12)
    expect(page.locator("#run-select")).to_be_hidden()
    page.evaluate("window.__samePage = true")
    shutil.copytree(messages_run, runs / "new", dirs_exist_ok=True)  # a run writes into it
    expect(page.locator("#run-select option")).to_have_count(2)
    expect(page.locator("#run-select")).to_be_visible()
    page.select_option("#run-select", label="new")
    expect(page.locator("#runs-table tbody tr")).to_have_count(12)
    assert "#/r/1" in page.url
    assert page.evaluate("window.__samePage") is True, "no reload"


def test_earlier_attempts_logs_are_offered_next_to_the_latest(
    viewer_of, messages_run, tmp_path, page
):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    (run / "episodes" / "mean-empty" / "0" / "attempt-1.log").write_text("the first try\n")
    viewer = viewer_of(str(run))
    page.goto(episode_url(viewer, 0, "episodes/mean-empty/0", "log"))
    expect(page.locator("#log-text")).to_contain_text("finished: finished")
    page.locator(".log-picker").get_by_role("button", name="attempt-1.log").click()
    expect(page.locator("#log-text")).to_have_text("the first try\n")
