// Two runs side by side per task: what changed from A to B (reward, exit reasons).
import { add, api, badge, clear, debounced, fmtReward, h, num, rewardCell } from "./dom.js";
import { episodeHref, replaceParams } from "./router.js";

const CHANGES = [
  ["improved", "improved", "B's mean reward is higher"],
  ["regressed", "regressed", "B's mean reward is lower"],
  ["exit_changed", "exit changed", "same reward, other exit reasons"],
  ["same", "same", "same reward and exit reasons"],
  ["only_a", "only in A", ""],
  ["only_b", "only in B", ""],
];

export async function renderCompare(main, params) {
  const runs = (await api("/api/runs")).runs;
  if (runs.length < 2) {
    main.append(h("section", { class: "card" }, h("p", {}, "Comparing needs two runs: start the viewer with both, e.g. "),
      h("pre", { class: "block" }, "uniagent view runs/model-a runs/model-b")));
    return null;
  }
  const query = {
    a: Number(params.get("a") ?? 0),
    b: Number(params.get("b") ?? 1),
    change: params.get("change") || "",
    q: params.get("q") || "",
    page: Number(params.get("page") || 1),
  };
  const size = 50;
  const pick = (id, value) => h("select", { id, "aria-label": id },
    runs.map((r) => h("option", { value: r.id, selected: r.id === value }, r.name)));
  const selectA = pick("compare-a", query.a);
  const selectB = pick("compare-b", query.b);
  const search = h("input", { type: "search", placeholder: "Search task ids…", value: query.q, id: "compare-q" });
  const head = h("div", { class: "compare-head" });
  const chips = h("div", { class: "chips", id: "compare-chips" });
  const table = h("table", { class: "runs compare", id: "compare-table" });
  const pager = h("div", { class: "pager" });
  main.append(h("section", { class: "card" },
    h("div", { class: "filters" }, h("span", { class: "ab" }, "A"), selectA, h("span", { class: "ab" }, "B"), selectB, search),
    head, chips, h("div", { class: "table-wrap" }, table), pager));

  const refresh = debounced(load);
  async function load() {
    const data = await api("/api/compare", {
      a: query.a, b: query.b, change: query.change, q: query.q, offset: (query.page - 1) * size, limit: size,
    });
    drawHead(data);
    drawChips(data.counts);
    drawTable(data.rows);
    const pages = Math.max(1, Math.ceil(data.total / size));
    clear(pager).append(
      h("button", { type: "button", class: "ghost", disabled: query.page <= 1, onclick: () => { query.page -= 1; changed(); } }, "‹ Prev"),
      h("span", { class: "range" }, `page ${query.page} of ${pages} · ${num(data.total)} tasks`),
      h("button", { type: "button", class: "ghost", disabled: query.page >= pages, onclick: () => { query.page += 1; changed(); } }, "Next ›"));
    main.dataset.loaded = String(Date.now());
  }

  function drawHead(data) {
    const m = data.mean_reward;
    const delta = m.a !== null && m.b !== null ? m.b - m.a : null;
    const exits = Object.entries(data.exit_reasons);
    const totalA = exits.reduce((t, [, c]) => t + c.a, 0);
    const totalB = exits.reduce((t, [, c]) => t + c.b, 0);
    const share = (count, total) => `${num(count)} (${total ? Math.round((100 * count) / total) : 0}%)`;
    add(clear(head),
      h("div", { class: "ab-cards" },
        abCard("A", data.a.name, m.a), abCard("B", data.b.name, m.b),
        h("div", { class: "card stat-card" }, h("div", { class: "stat-label" }, "change in mean reward"),
          h("div", { class: `big ${delta > 0 ? "up" : delta < 0 ? "down" : ""}` }, delta === null ? "–" : `${delta > 0 ? "+" : ""}${fmtReward(delta)}`),
          h("div", { class: "muted small" }, `over the ${num(m.tasks)} tasks both ran`))),
      exits.length ? h("table", { class: "mini exits" },
        h("thead", {}, h("tr", {}, h("th", {}, "exit reason"), h("th", { class: "num" }, "A"), h("th", { class: "num" }, "B"), h("th", { class: "num", title: "change in share, percentage points" }, "Δ share"))),
        h("tbody", {}, exits.map(([reason, c]) => h("tr", {}, h("td", {}, reason), h("td", { class: "num" }, share(c.a, totalA)), h("td", { class: "num" }, share(c.b, totalB)),
          h("td", { class: "num" }, points(c.a, totalA, c.b, totalB)))))) : null);
  }

  // The change in an exit reason's share, in percentage points.
  function points(a, totalA, b, totalB) {
    const d = Math.round(100 * ((totalB ? b / totalB : 0) - (totalA ? a / totalA : 0)));
    return d === 0 ? "·" : `${d > 0 ? "+" : ""}${d} pp`;
  }

  function abCard(label, name, mean) {
    return h("div", { class: "card stat-card" }, h("div", { class: "stat-label" }, `${label}: ${name}`),
      h("div", { class: "big" }, mean === null ? "–" : fmtReward(mean)), h("div", { class: "muted small" }, "mean reward"));
  }

  function drawChips(counts) {
    clear(chips).append(h("button", { type: "button", class: query.change ? "chip" : "chip active", onclick: () => { query.change = ""; query.page = 1; changed(); } }, "all"));
    for (const [key, label, help] of CHANGES) {
      if (!counts[key]) continue;
      chips.append(h("button", {
        type: "button", class: `chip ch-${key}${query.change === key ? " active" : ""}`, title: help, dataset: { change: key },
        onclick: () => { query.change = key; query.page = 1; changed(); },
      }, `${label} ${num(counts[key])}`));
    }
  }

  function side(runId, info) {
    if (!info) return h("td", { class: "muted" }, "not run");
    return h("td", {},
      h("span", { class: "samples" }, info.episodes.map((e) => h("a", {
        href: episodeHref(runId, e.key), class: `sq sq-${e.reward === null ? "none" : e.reward >= 1 ? "solved" : e.reward > 0 ? "partial" : "zero"}`,
        title: `sample ${e.sample}: ${e.status}, ${e.exit_reason || "no exit reason"}, reward ${fmtReward(e.reward)}`,
      }))),
      " ", rewardCell(info.mean_reward),
      h("span", { class: "exits muted small" }, " ", Object.entries(info.exit_reasons).map(([k, v]) => `${k}${v > 1 ? " ×" + v : ""}`).join(", ")));
  }

  function drawTable(rows) {
    const body = h("tbody");
    for (const r of rows) {
      const label = CHANGES.find(([k]) => k === r.change);
      body.append(h("tr", { dataset: { task: r.task_id, change: r.change } },
        h("td", { class: "task" }, r.task_id),
        side(query.a, r.a), side(query.b, r.b),
        h("td", { class: `num ${r.delta > 0 ? "up" : r.delta < 0 ? "down" : ""}` }, r.delta === null ? "–" : `${r.delta > 0 ? "+" : ""}${fmtReward(r.delta)}`),
        h("td", {}, badge(label ? label[1] : r.change, `ch-${r.change}`))));
    }
    if (!rows.length) body.append(h("tr", {}, h("td", { colspan: 5, class: "empty-row" }, "No tasks match.")));
    clear(table).append(h("thead", {}, h("tr", {}, ["Task", "A", "B", "Δ reward", "Change"].map((t) => h("th", { class: t === "Δ reward" ? "num" : "" }, t)))), body);
  }

  function changed() {
    const p = { a: query.a, b: query.b };
    if (query.change) p.change = query.change;
    if (query.q) p.q = query.q;
    if (query.page > 1) p.page = query.page;
    replaceParams("/compare", p);
    refresh();
  }
  selectA.onchange = () => { query.a = Number(selectA.value); query.page = 1; changed(); };
  selectB.onchange = () => { query.b = Number(selectB.value); query.page = 1; changed(); };
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { query.q = search.value.trim(); query.page = 1; changed(); }, 150);
  });
  await load();
  return { dispose: () => clearTimeout(typing) };
}
