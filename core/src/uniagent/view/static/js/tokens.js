// The token view: every token of the rollout, coloured by whose it is (prompt, model,
// environment) or by the model's log-prob, with model-call boundaries and the exactness report.
import { api, badge, clear, fmtReward, h, num } from "./dom.js";

const KIND = ["prompt", "model", "env"];
const KIND_LABEL = { prompt: "prompt", model: "model (mask 1)", env: "environment (mask 0)" };
const PAGE = 4000;

export async function renderTokens(body, runId, key, branch = null) {
  const url = `/api/runs/${runId}/episode/tokens`;
  // A harness episode's tree: one branch at a time (null: the main one, as saved).
  const on = branch === null ? {} : { branch };
  // The server's first tokens request loads the tokenizer (seconds, tens on a busy machine).
  const loading = h("section", { class: "card", id: "tokens-loading", role: "status" },
    h("p", { class: "muted" }, h("span", { class: "spinner", "aria-hidden": "true" }),
      "Loading the tokens… the first time, the viewer loads the tokenizer, which can take a while."));
  body.append(loading);
  const first = await api(url, { key, ...on, offset: 0, limit: 1 });
  if (!loading.isConnected) return null; // another tab was opened meanwhile
  if (!first.available) {
    loading.replaceWith(h("section", { class: "card", id: "tokens" }, h("p", { class: "muted" }, first.reason)));
    return null;
  }
  const view = h("div", { class: "token-view colour-mask", id: "token-view" });
  const scale = h("div", { class: "scale", hidden: true },
    h("span", {}, "model tokens by log-prob:  ≤ −5"), h("span", { class: "scale-bar" }), h("span", {}, "0 (certain)"));
  const controls = h("div", { class: "token-controls" },
    legend(),
    h("div", { class: "segmented", role: "group", "aria-label": "colour tokens by" },
      h("span", { class: "muted small" }, "colour by"),
      toggle("mask", "mask", true),
      toggle("logprob", "log-prob", false)),
    h("label", { class: "check" }, h("input", {
      type: "checkbox", id: "show-ids",
      onchange: (e) => view.classList.toggle("with-ids", e.target.checked),
    }), "ids"));
  const report = h("div", { class: "exactness", id: "exactness" });
  const marks = new Map(first.marks.map((m, i) => [m, i + 1]));
  const promptBox = h("div", { class: "tokens", id: "prompt-tokens" });
  const prompt = h("details", { class: "prompt-tokens" },
    h("summary", {}, h("span", { class: "tok k-prompt legend-item" }, "prompt"),
      ` ${num(first.prompt_length)} tokens: the system prompt, tool schemas and task, as the chat template renders them`),
    promptBox);
  let promptLoaded = false;
  prompt.addEventListener("toggle", () => {
    if (prompt.open && !promptLoaded) {
      promptLoaded = true;
      stream(promptBox, 0, first.prompt_length);
    }
  });
  const responseBox = h("div", { class: "tokens", id: "token-stream" });
  view.append(prompt, h("div", { class: "stream-label muted small" },
    `response: ${num(first.total - first.prompt_length)} tokens, model and environment interleaved; ▸ marks each model call`), responseBox);
  const section = h("section", { class: "card", id: "tokens" },
    branchPicker(first, branch, (chosen) => { section.remove(); renderTokens(body, runId, key, chosen); }),
    stats(first),
    first.tokenizer_note ? h("p", { class: "note" }, first.tokenizer_note) : null,
    report, controls, scale, view);
  loading.replaceWith(section);

  function toggle(value, label, on) {
    return h("button", {
      type: "button", class: on ? "seg active" : "seg", dataset: { colour: value }, id: `colour-${value}`,
      onclick: (e) => {
        for (const b of e.target.parentElement.querySelectorAll(".seg")) b.classList.toggle("active", b === e.target);
        view.classList.toggle("colour-mask", value === "mask");
        view.classList.toggle("colour-logprob", value === "logprob");
        scale.hidden = value !== "logprob";
      },
    }, label);
  }

  // Tokens [start, end) into box, a page at a time behind a "more" button.
  async function stream(box, start, end) {
    const more = h("div", { class: "more-row" });
    box.after(more);
    async function next(offset) {
      const page = await api(url, { key, ...on, offset, limit: Math.min(PAGE, end - offset) });
      const frag = document.createDocumentFragment();
      const special = new Set(page.special);
      for (let i = 0; i < page.ids.length; i++) {
        const index = page.offset + i;
        if (marks.has(index)) {
          frag.append(h("span", { class: "turn-mark", title: `model call ${marks.get(index)}: everything before this point was its input` }, `▸ call ${marks.get(index)}`));
        }
        frag.append(token(page, i, special.has(index)));
      }
      box.append(frag);
      const shown = page.offset + page.ids.length;
      clear(more);
      if (shown < end && page.ids.length) {
        more.append(h("button", { type: "button", class: "ghost more-tokens", onclick: () => next(shown) },
          `Show the next ${num(Math.min(PAGE, end - shown))} of ${num(end - shown)} more tokens`));
      }
      box.dataset.loaded = String(shown);
    }
    await next(start);
  }

  await stream(responseBox, first.prompt_length, first.total);
  hover(view);
  if (branch === null) loadExactness(report, runId, key, first);
  else {
    // The check re-renders the saved conversation, which is the saved rollout's only.
    report.append(h("div", { class: "muted small", id: "exactness-of-saved" },
      "Exactness report: of the saved rollout only (choose it above): this branch's own conversation is not saved to re-render."));
  }
  return null;
}

// Asks for an episode's first token in the background, so that its tokenizer is loaded on
// the server by the time the Tokens tab is opened.
export function warmTokens(runId, key) {
  api(`/api/runs/${runId}/episode/tokens`, { key, offset: 0, limit: 1 }).catch(() => {});
}

function token(page, i, special) {
  const kind = KIND[page.kind[i]];
  const lp = page.logprob[i];
  const text = page.text ? page.text[i] : null;
  const el = h("span", { class: `tok k-${kind}${special ? " special" : ""}` });
  el.dataset.i = page.offset + i;
  el.dataset.id = page.ids[i];
  el.dataset.kind = kind;
  if (lp !== null) {
    el.dataset.lp = lp;
    el.style.setProperty("--lp", String(Math.max(0, Math.min(1, 1 + lp / 5))));
  }
  if (text === null) {
    el.textContent = `${page.ids[i]} `;
    return el;
  }
  el.dataset.t = text;
  if (text === "") el.append(h("span", { class: "partial" }, "·"));
  else renderText(el, text);
  el.append(h("sub", { class: "tid" }, page.ids[i]));
  return el;
}

// Whitespace is made visible where it would vanish: a newline shows ↵ and breaks the line.
function renderText(el, text) {
  const parts = text.split("\n");
  parts.forEach((part, j) => {
    if (part) el.append(part.replace(/\t/g, "→   "));
    if (j < parts.length - 1) el.append(h("span", { class: "nl" }, "↵"), "\n");
  });
}

function legend() {
  return h("div", { class: "legend" }, KIND.map((k) => h("span", { class: `tok k-${k} legend-item` }, KIND_LABEL[k])));
}

function stats(page) {
  const c = page.counts;
  const items = [
    ["tokens", num(page.total)],
    ["prompt", num(c.prompt)],
    ["model", num(c.model)],
    ["environment", num(c.env)],
    ["model calls", num(page.marks.length)],
    ["mean log-prob", page.mean_logprob === null ? "–" : page.mean_logprob.toFixed(3)],
    ["min log-prob", page.min_logprob === null ? "–" : page.min_logprob.toFixed(2)],
  ];
  return h("div", { class: "token-stats" },
    items.map(([label, value]) => h("div", { class: "fact" }, h("span", { class: "fact-label" }, label), h("span", { class: "fact-value" }, value))),
    h("div", { class: "fact" }, h("span", { class: "fact-label" }, "prefix invariant"),
      page.prefix_ok ? badge("holds", "yes", "the context sent at every model call is a prefix of the final ids")
        : badge(`broken at calls ${page.prefix_violations.map((v) => v + 1).join(", ")}`, "no")),
    page.tokenizer ? h("div", { class: "fact" }, h("span", { class: "fact-label" }, "tokenizer"),
      h("span", { class: "fact-value mono small", title: page.tokenizer }, shortPath(page.tokenizer))) : null);
}

// The last parts of a tokenizer path name it; the whole path is in the tooltip.
function shortPath(path) {
  const parts = String(path).split("/").filter(Boolean);
  return parts.length > 3 ? "…/" + parts.slice(-3).join("/") : path;
}

// One tooltip for all tokens: cheap with tens of thousands of spans.
function hover(view) {
  const tip = document.getElementById("tooltip");
  view.addEventListener("mouseover", (event) => {
    const el = event.target.closest(".tok");
    if (!el) return;
    const lp = el.dataset.lp;
    const lines = [`token ${num(Number(el.dataset.i))} · id ${el.dataset.id}`, KIND_LABEL[el.dataset.kind]];
    if (lp !== undefined) lines.push(`log-prob ${Number(lp).toFixed(4)} · p ${Math.exp(Number(lp)).toFixed(3)}`);
    if (el.dataset.t !== undefined) lines.push(JSON.stringify(el.dataset.t));
    tip.textContent = lines.join("\n");
    const box = el.getBoundingClientRect();
    tip.hidden = false;
    tip.style.left = `${Math.min(window.innerWidth - 280, box.left + window.scrollX)}px`;
    tip.style.top = `${box.bottom + window.scrollY + 6}px`;
  });
  view.addEventListener("mouseleave", () => { tip.hidden = true; });
}

async function loadExactness(box, runId, key, page) {
  box.append(h("span", { class: "muted small" }, page.decoded ? "Checking exactness (a full re-render)…" : ""));
  const r = await api(`/api/runs/${runId}/episode/exactness`, { key });
  clear(box);
  if (!r.available) {
    box.append(h("div", { class: "muted small" }, `Exactness report: ${r.reason}`));
    return;
  }
  const labels = { think_block: "think block", retokenized: "retokenized", drift: "drift" };
  const kinds = Object.entries(r.kinds || {}).map(([k, v]) => `${labels[k] || k} ×${v}`).join(", ");
  let detail;
  if (r.ids_match) detail = "the ids equal a fresh chat-template render of the conversation";
  else if (r.ok) detail = `every difference from a fresh render is a known template effect (${kinds})`;
  else detail = `unexplained differences from a fresh render (${kinds})`;
  box.append(h("div", { class: `exactness-head ${r.ok ? "ok" : "bad"}` },
    h("b", {}, "Exactness "), r.ok ? badge("ok", "yes") : badge("FAILED", "no"),
    h("span", {}, ` ${detail} · prefix invariant ${r.prefix_ok ? "holds" : "broken"} · ${num(r.cache_length)} ids in the rollout, ${num(r.render_length)} re-rendered`)));
  if (r.differences && r.differences.length) {
    box.append(h("details", { class: "diffs" }, h("summary", {}, `${r.differences.length} differing region(s)`),
      h("table", { class: "mini" }, h("thead", {}, h("tr", {}, ["kind", "tokens", "rollout", "re-render"].map((t) => h("th", {}, t)))),
        h("tbody", {}, r.differences.map((d) => h("tr", { class: `d-${d.kind}` },
          h("td", {}, d.kind === "think_block" ? badge("think block", "policy", "the template drops or rewrites earlier <think> blocks: benign") : d.kind === "retokenized" ? badge("retokenized", "ok", "same text, another token split") : badge("drift", "no", "a real mismatch")),
          h("td", { class: "mono small" }, `${d.cache_start}–${d.cache_end}`),
          h("td", {}, h("code", {}, d.cache_text.slice(0, 200))),
          h("td", {}, h("code", {}, d.render_text.slice(0, 200)))))))));
  }
}

// The branches of a trajectory tree (compaction, retries, subagents each start one): pick one.
function branchPicker(page, branch, onPick) {
  const listed = page.branches || [];
  if (listed.length < 2) return null;
  // A tree rollout's branches are its leaves (named by their branch path, e.g. "0.1").
  const leaves = typeof listed[0].leaf === "string";
  const select = h("select", { id: "branch", onchange: (e) => onPick(e.target.value === "" ? null : Number(e.target.value)) },
    h("option", { value: "" }, leaves ? "the first leaf (as saved)" : "main branch (as saved)"),
    ...listed.map((b) => h("option", { value: String(b.index) }, leaves
      ? `leaf ${b.leaf}: reward ${fmtReward(b.reward)}, ${b.exit_reason || "–"}, ${num(b.turns ?? 0)} turns, ${num(b.tokens)} tokens (${num(b.model_tokens)} model)`
      : `branch ${b.index + 1}: ${num(b.turns)} calls, ${num(b.tokens)} tokens (${num(b.model_tokens)} model)`)));
  select.value = branch === null ? "" : String(branch);
  return h("div", { class: "branches" },
    h("label", { for: "branch" }, leaves ? `${listed.length} leaves in this tree rollout ` : `${listed.length} branches in this episode's tree `), select);
}
