// The runs table: every episode, sortable, filterable, paged; refreshed by live events.
import {
  api, clear, debounced, exitBadge, fmtReward, fmtSeconds, h, num, rewardCell, statusBadge, tamperBadge,
} from "./dom.js";
import { episodeHref, replaceParams } from "./router.js";

const COLUMNS = [
  { key: "task_id", label: "Task" },
  { key: "sample", label: "#", num: true, title: "sample" },
  { key: "status", label: "Status" },
  { key: "exit_reason", label: "Exit reason" },
  { key: "reward", label: "Reward", num: true },
  { key: "turns", label: "Turns", num: true },
  { key: null, label: "Tool calls" },
  { key: "setup_seconds", label: "Setup", num: true },
  { key: "model_seconds", label: "Model", num: true },
  { key: "env_seconds", label: "Env", num: true },
  { key: "reward_seconds", label: "Grading", num: true, title: "reward computation" },
  { key: "total_seconds", label: "Total", num: true },
];
const STATUSES = ["queued", "running", "finished", "failed", "interrupted"];
const REWARDS = [
  ["solved", "solved (≥ 1)"],
  ["partial", "partial (0 < r < 1)"],
  ["zero", "zero (≤ 0)"],
  ["none", "no reward"],
];
const PAGE_SIZES = [25, 50, 100, 200];

export async function renderRuns(main, runId, params) {
  const query = {
    q: params.get("q") || "",
    status: params.get("status") || "",
    exit: params.get("exit") || "",
    reward: params.get("reward") || "",
    sort: params.get("sort") || "order",
    order: params.get("order") || "asc",
    page: Number(params.get("page") || 1),
    size: Number(params.get("size") || 50),
  };
  const search = h("input", {
    type: "search",
    id: "filter-q",
    placeholder: "Search task ids…",
    value: query.q,
    "aria-label": "search task ids",
  });
  const status = h("select", { id: "filter-status", "aria-label": "status" });
  const exit = h("select", { id: "filter-exit", "aria-label": "exit reason" });
  const reward = h("select", { id: "filter-reward", "aria-label": "reward" });
  const size = h("select", { id: "page-size", "aria-label": "rows per page" },
    PAGE_SIZES.map((n) => h("option", { value: n, selected: n === query.size }, `${n} per page`)));
  const reset = h("button", { class: "ghost", type: "button" }, "Clear filters");
  const strip = h("div", { class: "strip", id: "run-strip" });
  const table = h("table", { class: "runs", id: "runs-table" });
  const pager = h("div", { class: "pager", id: "pager" });
  main.append(
    h("section", { class: "card" },
      strip,
      h("div", { class: "filters" }, search, status, exit, reward, reset),
      h("div", { class: "table-wrap" }, table),
      h("div", { class: "pager-row" }, pager, size)),
  );

  let counts = null;
  const refresh = debounced(load);

  async function load() {
    const data = await api(`/api/runs/${runId}/episodes`, {
      q: query.q,
      status: query.status,
      exit: query.exit,
      reward: query.reward,
      sort: query.sort,
      order: query.order,
      offset: (query.page - 1) * query.size,
      limit: query.size,
    });
    if (data.total && (query.page - 1) * query.size >= data.total) {
      query.page = Math.max(1, Math.ceil(data.total / query.size));
      return load();
    }
    counts = data.counts;
    fillSelects();
    drawStrip(data);
    drawTable(data.rows);
    drawPager(data.total);
    main.dataset.loaded = String(Date.now());
  }

  function fillSelects() {
    const fill = (select, all, entries, value) => {
      clear(select).append(h("option", { value: "" }, all));
      for (const [key, label, count] of entries) {
        select.append(h("option", { value: key, selected: key === value }, `${label} (${num(count || 0)})`));
      }
    };
    fill(status, "All statuses", STATUSES.filter((s) => counts.status[s] || s === query.status)
      .map((s) => [s, s, counts.status[s]]), query.status);
    const exits = Object.entries(counts.exit_reason);
    if (query.exit && !counts.exit_reason[query.exit]) exits.push([query.exit, 0]);
    fill(exit, "All exit reasons", exits.map(([k, c]) => [k, k, c]), query.exit);
    fill(reward, "Any reward", REWARDS.map(([k, label]) => [k, label, counts.reward[k]]), query.reward);
  }

  function drawStrip(data) {
    const s = counts.status;
    const total = Object.values(s).reduce((a, b) => a + b, 0);
    const item = (label, value, cls) => h("div", { class: `stat ${cls || ""}` },
      h("div", { class: "stat-value" }, value), h("div", { class: "stat-label" }, label));
    const filtered = data.total !== total;
    clear(strip).append(
      item("episodes", num(total)),
      ...STATUSES.filter((k) => s[k]).map((k) => item(k, num(s[k]), `st-${k}`)),
      item(filtered ? "mean reward (shown)" : "mean reward", data.mean_reward === null ? "–" : fmtReward(data.mean_reward), "st-reward"),
      item(filtered ? "solved (shown)" : "solved", num(counts.reward.solved || 0), "st-solved"),
    );
    if (filtered) strip.append(item("shown", num(data.total), "muted-stat"));
    if (data.run && data.run.kind === "tree") {
      strip.append(h("div", { class: "note" }, "A folder of episode folders (no results file): rows come from each result.json."));
    }
  }

  function header() {
    const row = h("tr");
    for (const col of COLUMNS) {
      const sorted = col.key && query.sort === col.key;
      const arrow = sorted ? (query.order === "desc" ? " ▼" : " ▲") : "";
      const th = h("th", { class: col.num ? "num" : "", title: col.title, "aria-sort": sorted ? (query.order === "desc" ? "descending" : "ascending") : null },
        col.key ? h("button", {
          class: "sort", type: "button", dataset: { sort: col.key },
          onclick: () => {
            if (query.sort === col.key) query.order = query.order === "asc" ? "desc" : "asc";
            else { query.sort = col.key; query.order = col.num ? "desc" : "asc"; }
            query.page = 1;
            changed();
          },
        }, col.label + arrow) : col.label);
      row.append(th);
    }
    return h("thead", {}, row);
  }

  function drawTable(rows) {
    const body = h("tbody");
    for (const r of rows) {
      const href = episodeHref(runId, r.key);
      const calls = Object.entries(r.tool_calls || {});
      const tr = h("tr", { dataset: { key: r.key, status: r.status }, class: `row-${r.status}` },
        h("td", { class: "task" }, h("a", { href }, r.task_id)),
        h("td", { class: "num" }, r.sample ?? "–"),
        h("td", {}, statusBadge(r.status)),
        h("td", {}, exitBadge(r.exit_reason), r.masked ? h("span", { class: "masked", title: "masked in training" }, "masked") : null),
        h("td", { class: "num" }, tamperBadge(r), rewardCell(r.reward), leavesNote(r)),
        h("td", { class: "num" }, r.turns ?? "–"),
        h("td", { class: "calls" }, calls.length ? calls.map(([n, c]) => h("span", { class: "call" }, `${n} ×${c}`)) : h("span", { class: "muted" }, "–")),
        ...["setup_seconds", "model_seconds", "env_seconds", "reward_seconds", "total_seconds"].map((k) => h("td", { class: "num time" }, fmtSeconds(r[k]))),
      );
      tr.addEventListener("click", (event) => {
        if (event.target.closest("a")) return;
        location.hash = href;
      });
      body.append(tr);
    }
    if (!rows.length) {
      body.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "empty-row" }, "No episodes match these filters.")));
    }
    clear(table).append(header(), body);
  }

  function drawPager(total) {
    const pages = Math.max(1, Math.ceil(total / query.size));
    const first = total ? (query.page - 1) * query.size + 1 : 0;
    const last = Math.min(total, query.page * query.size);
    const button = (label, page, disabled) => h("button", {
      type: "button", class: "ghost", disabled,
      onclick: () => { query.page = page; changed(); },
    }, label);
    clear(pager).append(
      button("‹ Prev", query.page - 1, query.page <= 1),
      h("span", { class: "range", id: "page-range" }, `${num(first)}–${num(last)} of ${num(total)}`),
      button("Next ›", query.page + 1, query.page >= pages),
    );
  }

  function changed() {
    const params = {};
    for (const [k, v] of Object.entries(query)) {
      const defaults = { sort: "order", order: "asc", page: 1, size: 50 };
      if (v !== "" && v !== defaults[k]) params[k] = v;
    }
    replaceParams(`/r/${runId}`, params);
    refresh();
  }

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { query.q = search.value.trim(); query.page = 1; changed(); }, 150);
  });
  status.onchange = () => { query.status = status.value; query.page = 1; changed(); };
  exit.onchange = () => { query.exit = exit.value; query.page = 1; changed(); };
  reward.onchange = () => { query.reward = reward.value; query.page = 1; changed(); };
  size.onchange = () => { query.size = Number(size.value); query.page = 1; changed(); };
  reset.onclick = () => {
    Object.assign(query, { q: "", status: "", exit: "", reward: "", page: 1 });
    search.value = "";
    changed();
  };

  await load();
  return { update: () => refresh(), dispose: () => clearTimeout(typing) };
}


// A tree rollout's row: its reward is its leaves' mean; how many leaves, how many solved.
function leavesNote(r) {
  const leaves = r.leaves || [];
  if (!leaves.length) return null;
  const solved = leaves.filter((l) => l.reward !== null && l.reward >= 1).length;
  return h("span", { class: "leaves-note muted small", title: "a tree rollout: the mean reward of its leaves (each counts as an episode in the summary)" },
    ` · ${solved}/${leaves.length} leaves solved`);
}
