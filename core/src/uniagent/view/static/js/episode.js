// One episode: header, then tabs for the conversation, the tokens, the result and the log.
import {
  add, api, badge, clear, debounced, exitBadge, fmtSeconds, h, looksLikeDiff, num, rewardCell,
  statusBadge, tamperBadge, textBlock,
} from "./dom.js";
import { replaceParams } from "./router.js";
import { renderTokens, warmTokens } from "./tokens.js";

const TABS = [
  ["conversation", "Conversation"],
  ["tokens", "Tokens"],
  ["result", "Result"],
  ["log", "Log"],
];

export async function renderEpisode(main, runId, params) {
  const key = params.get("key");
  let data = await api(`/api/runs/${runId}/episode`, { key });
  // A tree rollout opens on its tree; a leaf chosen there is shown in the Tokens tab.
  let tab = params.get("tab") || (data.tree ? "tree" : "conversation");
  let branch = params.get("branch") === null || params.get("branch") === "" ? null : Number(params.get("branch"));
  const head = h("section", { class: "card episode-head", id: "episode-head" });
  const tabs = h("div", { class: "tabs", role: "tablist" });
  const body = h("div", { class: "tab-body", id: "tab-body" });
  main.append(head, tabs, body);
  let panel = null;

  function drawHead() {
    const r = data.row;
    const m = data.record && data.record.metrics ? data.record.metrics : {};
    const calls = Object.entries(r.tool_calls || {});
    const first = data.tree && r.leaves && r.leaves.length ? r.leaves[0].leaf : null;
    add(clear(head),
      h("a", { class: "back", href: `#/r/${runId}` }, "← Episodes"),
      h("div", { class: "title-row" },
        h("h2", { id: "episode-title" }, r.task_id, h("span", { class: "sample" }, ` · sample ${r.sample ?? "–"}`)),
        h("div", { class: "title-badges" }, statusBadge(r.status), exitBadge(r.exit_reason),
          r.masked ? badge("masked", "masked", "kept out of training") : null,
          tamperBadge(r),
          h("span", { class: "reward-big", title: "reward" }, rewardCell(r.reward)))),
      h("div", { class: "facts" },
        data.tree ? fact("leaves", leavesFact(r)) : null,
        // A tree rollout's figures here are its first leaf's (as result.json's are).
        fact(first ? `turns (leaf ${first})` : "turns", r.turns ?? "–"),
        fact(first ? `tool calls (leaf ${first})` : "tool calls", calls.length ? calls.map(([n, c]) => `${n} ×${c}`).join(", ") : "–"),
        fact("format errors", m.format_errors ?? r.format_errors),
        fact("timeouts", m.timeouts ?? r.timeouts),
        r.inexact_turns ? fact("inexact turns", h("span", { class: "reward-zero", title: "the server's prompt differed from the rollout's ids: not token-exact (masked by default)" }, r.inexact_turns)) : null,
        fact("setup", fmtSeconds(r.setup_seconds)),
        fact("model", fmtSeconds(r.model_seconds)),
        fact("env", fmtSeconds(r.env_seconds)),
        fact("grading", fmtSeconds(r.reward_seconds)),
        fact("folder", r.key, "mono")),
      r.error ? h("div", { class: "error" }, r.error) : null,
      // Files that are there but could not be read (not JSON, too large): said per file.
      Object.entries(data.errors || {}).map(([name, why]) =>
        h("div", { class: "error file-error", "data-file": name }, why)),
    );
  }

  function drawTabs() {
    clear(tabs);
    for (const [id, label] of data.tree ? [["tree", "Tree"], ...TABS] : TABS) {
      tabs.append(h("button", {
        type: "button", role: "tab", class: id === tab ? "tab active" : "tab", id: `tab-${id}`,
        "aria-selected": String(id === tab),
        onclick: () => { tab = id; branch = null; replaceParams(`/r/${runId}/e`, { key, tab }); drawTabs(); show(); },
      }, label));
    }
  }

  async function show() {
    if (panel && panel.dispose) panel.dispose();
    clear(body);
    if (tab === "tree" && data.tree) panel = treeView(body, data.tree, openLeaf);
    else if (tab === "conversation") panel = conversation(body, data);
    else if (tab === "tokens") panel = await renderTokens(body, runId, key, branch);
    else if (tab === "result") panel = result(body, data);
    else panel = await logView(body, runId, key, data);
  }

  function openLeaf(leaf) {
    tab = "tokens";
    branch = leaf.index;
    replaceParams(`/r/${runId}/e`, { key, tab, branch });
    drawTabs();
    show();
  }

  const refresh = debounced(async () => {
    const before = data.row.status;
    data = await api(`/api/runs/${runId}/episode`, { key });
    drawHead();
    if (data.row.status !== before) await show();
    else if (panel && panel.update) await panel.update();
  });

  drawHead();
  drawTabs();
  if (tab !== "tokens") warmTokens(runId, key);
  await show();
  document.title = `${data.row.task_id} #${data.row.sample ?? ""} · ${data.run.name} · uniagent view`;
  return {
    // Only this episode's own changes reload it; the event lists the rows that changed.
    update: (info) => {
      if (info && Array.isArray(info.changed) && !info.changed.includes(key)) return;
      refresh();
    },
    dispose: () => panel && panel.dispose && panel.dispose(),
  };
}

function fact(label, value, cls) {
  return h("div", { class: "fact" }, h("span", { class: "fact-label" }, label), h("span", { class: `fact-value ${cls || ""}` }, value));
}

function leavesFact(r) {
  const leaves = r.leaves || [];
  const solved = leaves.filter((l) => l.reward !== null && l.reward >= 1).length;
  return `${leaves.length} (${solved} solved; the reward is their mean)`;
}

// ------------------------------------------------------------------ tree

// A tree rollout (interaction.branching): its branch points, each with the turn it split
// at, and its leaves, each with its reward and exit reason; a leaf opens its tokens.
function treeView(body, tree, openLeaf) {
  body.append(h("section", { class: "card tree-rollout", id: "tree" },
    h("p", { class: "muted small" },
      `A tree rollout of ${tree.leaves} leaves: at each branch point the episode went on several ways, `
      + "each leaf ran to its own end and was graded in its own sandbox. "
      + (tree.tokens ? "Choose a leaf to see its tokens and conversation as the model saw them." : "Its leaves saved no tokens (message mode).")),
    h("ul", { class: "tree" }, treeNode(tree.root, openLeaf, tree.tokens))));
  return null;
}

function treeNode(node, openLeaf, tokens) {
  const li = h("li", { class: node.children.length ? "tree-item tree-inner" : "tree-item", dataset: { branch: node.name } });
  if (node.children.length) {
    const s = node.split || {};
    li.append(h("div", { class: "tree-split", dataset: { turn: s.turn ?? "" }, title: s.why ? `branched because: ${s.why}` : "a branch point" },
      h("span", { class: "tree-name mono" }, node.name === "root" ? "root" : `branch ${node.name}`),
      h("span", { class: "tree-turn" }, s.turn !== undefined && s.turn !== null ? `split at turn ${s.turn}` : "split"),
      s.width ? h("span", { class: "muted small" }, `${s.width} ways`) : null));
  }
  if (node.leaf) li.append(leafButton(node.leaf, openLeaf, tokens));
  if (node.children.length) li.append(h("ul", {}, node.children.map((c) => treeNode(c, openLeaf, tokens))));
  return li;
}

function leafButton(leaf, openLeaf, tokens) {
  const usable = tokens && leaf.node !== null && leaf.node !== undefined;
  return h("button", {
    type: "button", class: "tree-leaf", disabled: !usable,
    dataset: { leaf: leaf.leaf, index: String(leaf.index) },
    title: usable ? "show this leaf's tokens" : "this leaf saved no tokens",
    onclick: () => openLeaf(leaf),
  },
  h("span", { class: "tree-name mono" }, `leaf ${leaf.leaf}`),
  h("span", { class: "tree-reward" }, rewardCell(leaf.reward)),
  exitBadge(leaf.exit_reason),
  leaf.score_reason ? h("span", { class: "flag", title: `the grader forced the score: ${leaf.score_reason}` }, leaf.score_reason.replace(/_/g, " ")) : null,
  leaf.traj_masked ? badge("masked", "masked", "kept out of training") : null,
  leaf.turns !== null && leaf.turns !== undefined ? h("span", { class: "muted small" }, `${leaf.turns} turns`) : null);
}

// ------------------------------------------------------------------ conversation

function conversation(body, data) {
  const messages = data.messages;
  if (!messages) {
    body.append(h("p", { class: "card muted" }, data.row.status === "running"
      ? "The conversation is saved when the episode ends; its log (Log tab) grows meanwhile."
      : "This episode saved no conversation (messages.json)."));
    return null;
  }
  if (data.tree) {
    body.append(h("p", { class: "note", id: "first-leaf-note" },
      "This is the first leaf's conversation; every leaf's tokens are in the Tree tab."));
  }
  const list = h("div", { class: "conversation", id: "conversation" });
  let turn = 0;
  messages.forEach((m, i) => {
    if (m.role === "assistant") turn += 1;
    list.append(message(m, i, turn));
  });
  body.append(list);
  return null;
}

function message(m, index, turn) {
  const role = m.role || "unknown";
  const content = typeof m.content === "string" ? m.content : m.content == null ? "" : JSON.stringify(m.content, null, 2);
  if (role === "system") {
    return h("details", { class: "msg msg-system" },
      h("summary", {}, h("span", { class: "role" }, "system prompt"), h("span", { class: "preview" }, content.split("\n")[0].slice(0, 140))),
      textBlock(content, { lines: 400, chars: 40000, cls: "prose" }));
  }
  // Calls a parser read from the text (messages.json notes them): shown like API calls,
  // the text outside them as the message, the text as written folded below.
  const parsed = Array.isArray(m.parsed_tool_calls) ? m.parsed_tool_calls : null;
  const observation = role === "tool" || (role === "user" && typeof m.tool_output_of === "string");
  const toolName = role === "tool" ? m.name : m.tool_output_of;
  const titles = { user: "user", assistant: `assistant · turn ${turn}` };
  const title = observation ? `observation${toolName ? " · " + toolName : ""}` : titles[role] || role;
  const card = h("div", { class: `msg msg-${observation ? "tool" : role}`, dataset: { index } },
    h("div", { class: "msg-head" }, h("span", { class: "role" }, title)));
  if (m.reasoning_content) {
    card.append(h("details", { class: "reasoning" }, h("summary", {}, "reasoning"), textBlock(m.reasoning_content, { cls: "prose" })));
  }
  const shown = parsed && typeof m.parsed_content === "string" ? m.parsed_content : content;
  if (observation) card.append(textBlock(content, { lines: 24 }));
  else if (shown.trim()) card.append(textBlock(shown, { lines: 60, chars: 8000, cls: "prose" }));
  for (const call of m.tool_calls || []) card.append(toolCall(call));
  for (const call of parsed || []) card.append(toolCall(call, true));
  if (parsed) {
    card.append(h("details", { class: "raw-text" }, h("summary", {}, "as the model wrote it"),
      textBlock(content, { lines: 60, chars: 8000 })));
  }
  return card;
}

function toolCall(call, fromText) {
  const fn = call.function || call;
  let args = fn.arguments;
  if (typeof args === "string") {
    try { args = JSON.parse(args); } catch { /* shown as the raw text below */ }
  }
  const box = h("div", { class: "tool-call", dataset: { source: fromText ? "text" : "api" } },
    h("div", { class: "tool-name" }, "→ ", h("b", {}, fn.name || "?"),
      fromText ? h("span", { class: "muted small", title: "the parser read this call from the model's text" }, " · parsed from the text") : null));
  if (args && typeof args === "object" && !Array.isArray(args)) {
    const entries = Object.entries(args);
    if (entries.length === 1 && entries[0][0] === "command" && typeof entries[0][1] === "string") {
      box.append(h("pre", { class: "block shell" }, entries[0][1]));
    } else if ("old_str" in args || "new_str" in args) {
      const rest = entries.filter(([k]) => k !== "old_str" && k !== "new_str");
      add(box, argTable(rest), editDiff(args.old_str || "", args.new_str || ""));
    } else {
      add(box, argTable(entries));
    }
  } else if (args !== undefined && args !== null && args !== "") {
    box.append(h("pre", { class: "block" }, String(args)));
  }
  return box;
}

function argTable(entries) {
  if (!entries.length) return null;
  return h("table", { class: "args" }, entries.map(([k, v]) => h("tr", {},
    h("th", {}, k),
    h("td", {}, typeof v === "string" && (v.includes("\n") || v.length > 120) ? textBlock(v, { lines: 30 }) : h("code", {}, typeof v === "string" ? v : JSON.stringify(v))))));
}

// An editor replacement shown as removed and added lines.
function editDiff(oldStr, newStr) {
  const pre = h("pre", { class: "block diff" });
  for (const line of oldStr.split("\n")) if (oldStr) pre.append(h("span", { class: "dl dl-del" }, "-" + line + "\n"));
  for (const line of newStr.split("\n")) if (newStr) pre.append(h("span", { class: "dl dl-add" }, "+" + line + "\n"));
  return pre;
}

// ------------------------------------------------------------------ result

function result(body, data) {
  const rec = data.record;
  if (!rec) {
    body.append(h("p", { class: "card muted" }, NO_RESULT[data.row.status] || NO_RESULT.finished));
    return null;
  }
  const submission = rec.submission;
  // add, not body.append: the sections a record lacks (rubric, tools) are null, which
  // Element.append would show as the text "null".
  add(body,
    h("section", { class: "card" }, h("h3", {}, "Outcome"),
      h("div", { class: "facts" },
        fact("reward", rewardCell(rec.reward)),
        fact("exit reason", exitBadge(rec.exit_reason)),
        fact("masked in training", rec.traj_masked ? "yes" : "no"),
        turnScores(rec.turn_scores)),
      forced(rec.reward_info || {}),
      rec.error ? h("div", { class: "error" }, h("b", {}, "error: "), rec.error) : null),
    toolList(data.tools),
    h("section", { class: "card", id: "submission" }, h("h3", {}, "Submission"),
      submission ? textBlock(submission, { lines: 80, chars: 20000, cls: looksLikeDiff(submission) ? "diff" : "" }) : h("p", { class: "muted" }, "No submission.")),
    h("section", { class: "card", id: "integrity" }, h("h3", {}, "Grading integrity"),
      integrity((rec.reward_info || {}).integrity || rec.integrity)),
    rubric(rec.reward_info || {}),
    h("section", { class: "card", id: "reward-info" }, h("h3", {}, "Reward details"), rewardInfo(rec.reward_info || {})),
  );
  return null;
}

// Why an episode has no result, by its status.
const NO_RESULT = {
  queued: "No result yet: the episode has not started.",
  running: "No result yet: the episode has not finished.",
  interrupted: "No result: the run stopped before this episode finished.",
  failed: "No result: the episode failed before it saved one (its error is above, its log in the Log tab).",
  finished: "No result: this episode saved none (no result.json, no line in the results file).",
};

// The tools the model saw: name, where it came from (a plugin, or an MCP server), parameters.
function toolList(tools) {
  if (!Array.isArray(tools) || !tools.length) return null;
  const params = (schema) => Object.entries((schema && schema.properties) || {}).map(([k, v]) =>
    `${k}${((schema.required || []).includes(k)) ? "" : "?"}: ${(v && v.type) || "any"}`).join(", ");
  return h("section", { class: "card", id: "tools" }, h("h3", {}, `Tools (${tools.length})`),
    h("table", { class: "mini" },
      h("thead", {}, h("tr", {}, ["tool", "from", "parameters", "description"].map((t) => h("th", {}, t)))),
      h("tbody", {}, tools.map((t) => h("tr", { dataset: { tool: t.name } },
        h("td", { class: "mono" }, t.name), h("td", { class: "mono" }, t.server || "plugin"),
        h("td", { class: "mono small" }, params(t.parameters) || "–"),
        h("td", { class: "small" }, String(t.description || "").slice(0, 200)))))));
}

// Per-turn scores ({turn index: score}, the tools' and the reward's), turns counted from 1 as the log does.
function turnScores(scores) {
  if (!scores || typeof scores !== "object" || !Object.keys(scores).length) return null;
  const text = Object.entries(scores).sort((a, b) => Number(a[0]) - Number(b[0]))
    .map(([turn, score]) => `turn ${Number(turn) + 1}: ${score ?? "–"}`).join(", ");
  return fact("turn scores", text);
}

// A rubric's components (trained on, by weight) and metrics (logged only), each with its details.
function rubric(info) {
  const parts = [["rubric", info.rubric], ["metric", info.metrics]].filter(([, v]) => v && typeof v === "object");
  if (!parts.length) return null;
  const rows = [];
  for (const [kind, entries] of parts) {
    for (const [key, c] of Object.entries(entries)) {
      rows.push(h("tr", { class: kind === "metric" ? "noted" : "" },
        h("td", { class: "mono" }, key), h("td", { class: "mono" }, String(c.reward || "")),
        h("td", {}, kind === "metric" ? "metric (not trained on)" : value(c.weight)),
        h("td", {}, value(c.score)), h("td", {}, value(c.info))));
    }
  }
  return h("section", { class: "card", id: "rubric" }, h("h3", {}, `Rubric (${info.aggregate || "weighted-sum"})`),
    h("table", { class: "mini" },
      h("thead", {}, h("tr", {}, ["key", "reward", "weight", "score", "details"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
}

function forced(info) {
  if (!info.score_reason) return null;
  return h("div", { class: "error", id: "score-forced" }, h("b", {}, `Score forced: ${String(info.score_reason).replace(/_/g, " ")}`),
    info.detail ? ` — ${String(info.detail).slice(0, 400)}` : "");
}

// What the grader protected, what it found changed, and whether that forced the score.
function integrity(report) {
  if (!report || typeof report !== "object") return h("p", { class: "muted" }, "The grader recorded no integrity report.");
  const tampered = Array.isArray(report.tampered) ? report.tampered : null;
  const parts = [];
  parts.push(h("div", { class: "facts" },
    report.grade_in ? fact("graded in", report.grade_in === "fresh" ? "a fresh sandbox" : "the episode's sandbox") : null,
    report.protected_files !== undefined ? fact("protected files", num(report.protected_files)) : null,
    report.toolchain_files !== undefined ? fact("toolchain files", num(report.toolchain_files)) : null,
    report.base_commit ? fact("base commit", String(report.base_commit).slice(0, 12), "mono") : null,
    Array.isArray(report.patch_files) ? fact("files in the patch", report.patch_files.length ? report.patch_files.join(", ") : "none", "mono") : null,
    fact("history scrub", report.history_scrub ? JSON.stringify(withoutNulls(report.history_scrub)) : "–")));
  if (tampered === null) {
    parts.push(h("p", { class: "muted small" }, "Baseline only: the episode was not graded."));
  } else if (!tampered.length) {
    parts.push(h("p", {}, badge("no tampering found", "yes", "protected files, code and tools were as before the first turn")));
  } else {
    parts.push(h("table", { class: "mini tamper", id: "tampered" },
      h("thead", {}, h("tr", {}, ["kind", "path", "change", "rule", "detail"].map((t) => h("th", {}, t)))),
      h("tbody", {}, tampered.map((t) => h("tr", { class: t.scores === false ? "noted" : "scored" },
        h("td", {}, String(t.kind || "")), h("td", { class: "mono" }, String(t.path || "")),
        h("td", {}, String(t.change || "")), h("td", {}, String(t.rule || "")),
        h("td", { class: "small" }, t.scores === false ? `noted, not scored${t.detail ? ": " + t.detail : ""}` : String(t.detail || "")))))));
  }
  return h("div", {}, parts);
}

// An object's fields that hold a value (null ones say nothing).
function withoutNulls(value) {
  if (!value || typeof value !== "object" || Array.isArray(value)) return value;
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null && v !== undefined));
}

// Shown elsewhere on the tab: the test lists above, the integrity report, the forced score.
const OWN_PLACE = ["tests_status", "integrity", "score_reason", "detail", "rubric", "metrics", "aggregate"];

function rewardInfo(info) {
  const entries = Object.entries(info).filter(([k]) => !OWN_PLACE.includes(k));
  const parts = [];
  if (info.tests_status) parts.push(testsStatus(info.tests_status));
  if (!entries.length && !parts.length) return h("p", { class: "muted" }, "The reward reported no other details.");
  const table = h("table", { class: "args info" });
  for (const [k, v] of entries) {
    const warn = /tamper|infra_failure$|mismatch/i.test(k) && v && (typeof v !== "object" || Object.keys(v).length);
    table.append(h("tr", { class: warn ? "warn" : "" }, h("th", {}, k), h("td", {}, value(v))));
  }
  parts.push(table);
  return h("div", {}, parts);
}

function value(v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "–");
  if (typeof v === "boolean") return badge(v ? "yes" : "no", v ? "yes" : "no");
  if (typeof v === "string") return v.includes("\n") || v.length > 160 ? textBlock(v, { lines: 20 }) : h("code", {}, v);
  if (typeof v === "number") return h("code", {}, String(v));
  return textBlock(JSON.stringify(v, null, 2), { lines: 20 });
}

// SWE-bench style: {FAIL_TO_PASS: {success: [...], failure: [...]}, PASS_TO_PASS: {...}}.
function testsStatus(status) {
  const box = h("div", { class: "tests", id: "tests-status" });
  for (const [group, result] of Object.entries(status)) {
    if (!result || typeof result !== "object") continue;
    const rows = [];
    for (const [outcome, tests] of Object.entries(result)) {
      for (const test of tests || []) rows.push([outcome, test]);
    }
    const ok = rows.filter(([o]) => o === "success").length;
    box.append(h("details", { class: "test-group", open: rows.length <= 40 },
      h("summary", {}, h("b", {}, group), ` ${num(ok)}/${num(rows.length)} passing`),
      h("ul", {}, rows.map(([outcome, test]) => h("li", { class: `test test-${outcome}` }, h("span", { class: "mark" }, outcome === "success" ? "✓" : "✗"), test)))));
  }
  return box;
}

// ------------------------------------------------------------------ log

async function logView(body, runId, key, data) {
  // log.txt: the latest attempt's; attempt-<n>.log: earlier attempts' (log.<name>.txt: older runs)
  const logs = (data.files || []).filter((f) => /^(log(\..+)?\.txt|attempt-\d+\.log)$/.test(f.name)).map((f) => f.name);
  let name = logs.includes("log.txt") ? "log.txt" : logs[0] || "log.txt";
  const picker = logs.length > 1 ? h("div", { class: "log-picker" }) : null;
  const pre = h("pre", { class: "block log", id: "log-text" });
  const note = h("div", { class: "muted small" });
  body.append(h("section", { class: "card" }, picker, note, pre));
  async function load() {
    const log = await api(`/api/runs/${runId}/episode/log`, { key, name });
    pre.textContent = log.text || "(empty)";
    note.textContent = `${name} · ${num(log.size)} bytes${log.truncated ? " · showing the end" : ""}`;
  }
  if (picker) {
    for (const n of logs) picker.append(h("button", { type: "button", class: "ghost", onclick: () => { name = n; load(); } }, n));
  }
  await load();
  // A running episode's log grows without any row changing: follow it every 2 s.
  const timer = data.row.status === "running" ? setInterval(load, 2000) : null;
  return { update: load, dispose: () => clearInterval(timer) };
}
