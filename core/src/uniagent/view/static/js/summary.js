// The summary: headline figures and distributions as plain HTML charts.
import { api, clear, debounced, exitFamily, fmtReward, fmtSeconds, h, num, pct } from "./dom.js";

const PHASES = [
  ["setup_seconds", "setup", "sandbox start and tool install"],
  ["model_seconds", "model", "waiting for the model"],
  ["env_seconds", "env", "running actions in the sandbox"],
  ["reward_seconds", "grading", "computing the reward"],
];

export async function renderSummary(main, runId) {
  const root = h("div", { class: "summary", id: "summary" });
  main.append(root);
  const refresh = debounced(async () => draw(await api(`/api/runs/${runId}/summary`)));

  function draw(s) {
    clear(root);
    const n = s.samples_per_task;
    const cards = [
      card("Episodes", num(s.episodes), `${num(s.tasks)} tasks × ${n} sample${n > 1 ? "s" : ""}`
        + (s.episodes > s.tasks * n ? "; a tree rollout's leaves count one each" : "")),
      card("Mean reward", s.mean_reward === null ? "–" : fmtReward(s.mean_reward),
        `over ${num(s.rewarded_episodes)} rewarded episodes`, "accent"),
    ];
    for (const [k, v] of Object.entries(s.pass_at_k || {})) {
      cards.push(card(k, v === null ? "–" : v.toFixed(3), `unbiased estimator over ${num(s.tasks)} tasks`));
    }
    cards.push(card("Masked", pct(s.masked_share), `${num(s.masked_episodes)} episodes kept out of training`));
    cards.push(card("Tampered", num(s.tampered_episodes), "graded episodes whose agent changed protected files, code or tools", s.tampered_episodes ? "alarm" : ""));
    const solved = (s.reward_classes || {}).solved || 0;
    cards.push(card("Solved", num(solved), `reward ≥ 1 of ${num(s.episodes)}`));
    root.append(h("div", { class: "cards" }, cards));

    const status = Object.entries(s.status).filter(([, c]) => c);
    root.append(
      h("div", { class: "grid" },
        panel("Exit reasons", bars(Object.entries(s.exit_reasons), (k) => `bar-${exitFamily(k)}`), "exit-chart"),
        panel("Tool calls", bars(Object.entries(s.tool_calls), () => "bar-tool"), "tool-chart"),
        panel("Turns per episode", columns(s.turns_histogram, "turns"), "turns-chart"),
        panel("Reward distribution", columns(s.reward_histogram, "reward", rewardColour), "reward-chart"),
        panel("Where the time went", timeBreakdown(s), "time-chart"),
        panel("Status", bars(status, (k) => `bar-st-${k}`), "status-chart"),
        panel("Probing the grader", probing(s), "integrity-chart"),
        s.servers ? panel("Model servers", servers(s.servers), "server-chart") : null,
      ),
    );
    const errors = s.errors || {};
    root.append(h("p", { class: "muted small" },
      `Format errors ${num(errors.format_errors)} · syntax errors ${num(errors.syntax_errors)} · action timeouts ${num(errors.timeouts)}`,
      s.saved && s.saved.wall_seconds ? ` · wall time of the last invocation ${fmtSeconds(s.saved.wall_seconds)}` : ""));
  }

  await refresh();
  return { update: () => refresh() };
}

function card(label, value, note, cls) {
  return h("div", { class: `card stat-card ${cls || ""}` },
    h("div", { class: "stat-label" }, label),
    h("div", { class: "big" }, value),
    note ? h("div", { class: "muted small" }, note) : null);
}

function panel(title, body, id) {
  return h("section", { class: "card panel", id }, h("h3", {}, title), body);
}

function empty() {
  return h("p", { class: "muted" }, "No finished episodes yet.");
}

// Horizontal bars: label, bar, count; widths relative to the largest.
function bars(entries, cls) {
  if (!entries.length) return empty();
  const max = Math.max(...entries.map(([, c]) => c));
  const total = entries.reduce((a, [, c]) => a + c, 0);
  return h("div", { class: "hbars" }, entries.map(([label, count]) => h("div", { class: "hbar", title: `${label}: ${count} (${pct(count / total)})` },
    h("span", { class: "hbar-label" }, label),
    h("span", { class: "hbar-track" }, h("span", { class: `hbar-fill ${cls(label)}`, style: { width: `${(100 * count) / max}%` } })),
    h("span", { class: "hbar-count" }, num(count)))));
}

// A histogram as columns; each column's height is its share of the tallest.
function rewardColour(bin) {
  return bin.hi >= 1 ? "fill-solved" : bin.lo > 0 ? "fill-partial" : bin.hi <= 0 ? "fill-zero" : "";
}

function columns(hist, what, colour) {
  if (!hist || !hist.length) return empty();
  const max = Math.max(...hist.map((b) => b.count), 1);
  return h("div", { class: "vbars" }, hist.map((b) => h("div", { class: "vbar", title: `${what} ${b.label}: ${b.count}` },
    h("span", { class: "vbar-count" }, b.count ? num(b.count) : ""),
    h("span", { class: "vbar-col" }, h("span", { class: `vbar-fill ${colour ? colour(b) : ""}`, style: { height: `${(100 * b.count) / max}%` } })),
    h("span", { class: "vbar-label" }, b.label))));
}

function timeBreakdown(s) {
  const totals = s.time_seconds || {};
  const sum = PHASES.reduce((a, [k]) => a + (totals[k] || 0), 0);
  if (!sum) return empty();
  const stack = h("div", { class: "stack" }, PHASES.map(([k, label, help]) => {
    const share = (totals[k] || 0) / sum;
    return h("span", { class: `stack-part ph-${label}`, style: { width: `${100 * share}%` }, title: `${label} (${help}): ${fmtSeconds(totals[k])}, ${pct(share)}` },
      share > 0.08 ? label : "");
  }));
  const table = h("table", { class: "mini" },
    h("thead", {}, h("tr", {}, h("th", {}, "phase"), h("th", { class: "num" }, "total"), h("th", { class: "num" }, "per episode"), h("th", { class: "num" }, "share"))),
    h("tbody", {}, PHASES.map(([k, label, help]) => h("tr", {},
      h("td", { title: help }, h("span", { class: `swatch ph-${label}` }), label),
      h("td", { class: "num" }, fmtSeconds(totals[k])),
      h("td", { class: "num" }, fmtSeconds((s.mean_seconds || {})[k])),
      h("td", { class: "num" }, pct((totals[k] || 0) / sum))))));
  return h("div", {}, stack, table);
}

// Tamper reports: per kind and rule, and over the run (graded episodes in the order they
// finished), so that a run shows when its policy starts probing the grader.
function probing(s) {
  const integrity = s.integrity || {};
  const timeline = s.integrity_timeline || [];
  if (!timeline.length) return h("p", { class: "muted" }, "No graded episodes yet.");
  const kinds = Object.entries(integrity.tampered || {}).filter(([, c]) => c).map(([k, c]) => [`tampered: ${k}`, c]);
  const classes = Object.entries(integrity.classes || {}).filter(([, c]) => c).map(([k, c]) => [`class: ${k}`, c]);
  const rules = Object.entries(integrity.rules || {}).map(([k, c]) => [`rule: ${k}`, c]);
  const counts = [...kinds, ...classes, ...rules];
  const over = timeline.map((b) => ({ label: b.label, count: b.tampered, hi: 0, lo: 0 }));
  // One chart per attack class the run shows (docs/rewards.md): when its policy starts on it.
  const perClass = classes.map(([label]) => {
    const name = label.slice("class: ".length);
    const bins = timeline.map((b) => ({ label: b.label, count: (b.classes || {})[name] || 0, hi: 0, lo: 0 }));
    return h("div", { class: "integrity-class", "data-class": name },
      h("h4", {}, `Episodes showing ${name} over the run`), columns(bins, name, () => "fill-zero"));
  });
  return h("div", {},
    h("p", { class: "muted small" }, `${num(integrity.tampered_episodes || 0)} of ${num(integrity.graded_episodes || 0)} graded episodes report tampering`),
    counts.length ? bars(counts, () => "bar-tamper") : h("p", { class: "muted" }, "No tamper reports."),
    h("h4", {}, "Tampering episodes over the run"),
    columns(over, "episodes", () => "fill-zero"),
    ...perClass);
}

// A run with several model servers: episodes that ended on each (bars), with their
// generated tokens and the attempts lost there (retried elsewhere).
function servers(shares) {
  const entries = Object.entries(shares).map(([name, v]) => [name, v.episodes]);
  return h("div", {},
    bars(entries, () => "bar-tool"),
    h("p", { class: "muted small" }, Object.entries(shares).map(([name, v]) =>
      `${name}: ${num(v.generated_tokens)} tokens, ${num(v.failed_attempts)} attempts lost`).join(" · ")));
}
