// Small DOM and formatting helpers. Everything from a run folder is untrusted (the policy
// wrote it): it only ever reaches the page as text nodes, never as HTML.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "style" && typeof value === "object") Object.assign(el.style, value);
    else el.setAttribute(name, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

// Element.append turns null into the text "null": this skips empty children instead.
export function add(el, ...children) {
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export async function api(path, params) {
  const query = params ? "?" + new URLSearchParams(clean(params)).toString() : "";
  const response = await fetch(path + query, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

export function clean(params) {
  const out = {};
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) out[k] = v;
  return out;
}

export const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

export function fmtReward(r) {
  if (r === null || r === undefined) return "–";
  return Number.isInteger(r) ? r.toFixed(1) : r.toFixed(3).replace(/0+$/, "").replace(/\.$/, ".0");
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function pct(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(x < 0.1 && x > 0 ? 1 : 0)}%`;
}

// Exit reasons in three families: the policy's normal end, its own failures, infrastructure
// (the server's list, from the default exit policy).
let INFRA = new Set();
export function setInfraExits(reasons) {
  INFRA = new Set(reasons || []);
}
export function exitFamily(reason) {
  if (!reason) return "none";
  if (reason === "finished") return "ok";
  return INFRA.has(reason) ? "infra" : "policy";
}

export function badge(text, kind, title) {
  return h("span", { class: `badge badge-${kind}`, title }, text);
}

export function statusBadge(status) {
  return badge(status, `status-${status}`, statusHelp[status]);
}

const statusHelp = {
  queued: "planned, not started yet",
  running: "started: its folder exists, no result yet",
  finished: "ended with a policy outcome (see the exit reason)",
  failed: "ended by an infrastructure failure, or could not start",
  interrupted: "started, but the run stopped before it finished (a resume reruns it)",
};

export function exitBadge(reason) {
  if (!reason) return h("span", { class: "muted" }, "–");
  const family = { ok: "the policy ended the episode", policy: "the policy's own failure", infra: "an infrastructure failure" };
  return badge(reason, `exit-${exitFamily(reason)}`, `exit reason: ${family[exitFamily(reason)]}`);
}

export function tamperBadge(row) {
  if (!row.tampered && !row.score_reason) return null;
  const text = row.tampered ? "tampered" : row.score_reason.replace(/_/g, " ");
  const title = row.tampered
    ? `the grader found ${row.tampered} change(s) to protected files, code or tools` + (row.score_reason ? `; score forced (${row.score_reason})` : "")
    : `the grader forced the score: ${row.score_reason}`;
  return h("span", { class: "flag", title }, text);
}

export function rewardCell(reward) {
  const cls = reward === null || reward === undefined ? "none" : reward >= 1 ? "solved" : reward > 0 ? "partial" : "zero";
  return h("span", { class: `reward reward-${cls}` }, fmtReward(reward));
}

// Long text folds: the head is shown, the rest is one click away.
export function folded(text, { lines = 18, chars = 2400, cls = "" } = {}) {
  const all = text.split("\n");
  const pre = h("pre", { class: `block ${cls}` });
  if (all.length <= lines + 4 && text.length <= chars + 400) {
    fill(pre, text);
    return pre;
  }
  let head = all.slice(0, lines).join("\n");
  if (head.length > chars) head = head.slice(0, chars);
  fill(pre, head);
  const rest = all.length - head.split("\n").length;
  const more = h(
    "button",
    {
      class: "fold",
      onclick: () => {
        fill(clear(pre), text);
        more.remove();
      },
    },
    rest > 0 ? `Show ${num(rest)} more lines` : `Show ${num(text.length - head.length)} more characters`,
  );
  return h("div", { class: "folded" }, pre, more);
}

// A unified diff is shown with its added and removed lines coloured.
export function looksLikeDiff(text) {
  return /^(diff --git |@@ -\d|--- \S.*\n\+\+\+ \S)/m.test(text || "");
}

function fill(pre, text) {
  if (!pre.classList.contains("diff")) {
    pre.textContent = text;
    return pre;
  }
  for (const line of text.split("\n")) {
    let kind = "ctx";
    if (/^(diff --git|index |--- |\+\+\+ )/.test(line)) kind = "meta";
    else if (line.startsWith("@@")) kind = "hunk";
    else if (line.startsWith("+")) kind = "add";
    else if (line.startsWith("-")) kind = "del";
    pre.append(h("span", { class: `dl dl-${kind}` }, line + "\n"));
  }
  return pre;
}

export function textBlock(text, opts = {}) {
  const value = text ?? "";
  if (value === "") return h("pre", { class: "block empty" }, "(no output)");
  return folded(value, { ...opts, cls: looksLikeDiff(value) ? "diff" : opts.cls || "" });
}

export function debounced(fn) {
  // One call in flight; calls meanwhile collapse into one more afterwards.
  let running = false;
  let again = false;
  return async function run() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } finally {
      running = false;
      if (again) {
        again = false;
        run();
      }
    }
  };
}
