// The page: a hash router over four views, the run picker, and the live connection.
import { api, clear, h, num, setInfraExits } from "./dom.js";
import { go, parseHash } from "./router.js";
import { renderRuns } from "./runs.js";
import { renderSummary } from "./summary.js";
import { renderEpisode } from "./episode.js";
import { renderCompare } from "./compare.js";

const state = { runs: [], runsVersion: null, view: null, source: null, sourceRun: null, routes: 0, missed: false };

// Which run and page the URL names.
function where() {
  const { parts, params } = parseHash();
  let runId = 0;
  let page = "episodes";
  if (parts[0] === "r" && parts[1] !== undefined) {
    runId = Number(parts[1]);
    if (parts[2] === "summary") page = "summary";
    else if (parts[2] === "e") page = "episode";
  } else if (parts[0] === "compare") {
    page = "compare";
  }
  if (!state.runs[runId]) runId = 0;
  return { runId, page, params };
}

async function route() {
  const { runId, page, params } = where();
  const main = document.getElementById("view");
  if (state.view && state.view.dispose) state.view.dispose();
  state.view = null;
  header(runId, page);
  listen(page === "compare" ? null : runId);
  const titles = { episodes: "episodes", summary: "summary", compare: "compare" };
  document.title = `${page === "compare" ? "" : state.runs[runId].name + " · "}${titles[page] || "episode"} · uniagent view`;
  // Each page renders into its own box: one still loading after the user moved on
  // then fills a box that is no longer on the page.
  const box = h("div", { class: "page", id: `page-${page}` });
  clear(main).append(box);
  const current = ++state.routes;
  state.missed = false;
  let view = null;
  try {
    if (page === "episodes") view = await renderRuns(box, runId, params);
    else if (page === "summary") view = await renderSummary(box, runId, params);
    else if (page === "episode") view = await renderEpisode(box, runId, params);
    else view = await renderCompare(box, params);
  } catch (err) {
    if (current === state.routes) {
      clear(box).append(h("div", { class: "error pad" }, `Could not load this page: ${err.message}`));
    }
  }
  if (current !== state.routes) {
    if (view && view.dispose) view.dispose(); // the user moved on while it loaded
    return;
  }
  state.view = view;
  // An update that came while the page was loading may postdate what it loaded.
  if (state.missed && view && view.update) view.update();
}

function header(runId, page) {
  const select = document.getElementById("run-select");
  clear(select);
  select.hidden = state.runs.length < 2 || page === "compare";
  state.runs.forEach((run, i) => select.append(h("option", { value: i, selected: i === runId }, run.name)));
  select.onchange = () => go(`/r/${select.value}`);
  const nav = clear(document.getElementById("nav"));
  const link = (label, href, active) => h("a", { href, class: active ? "active" : "" }, label);
  nav.append(
    link("Episodes", `#/r/${runId}`, page === "episodes" || page === "episode"),
    link("Summary", `#/r/${runId}/summary`, page === "summary"),
  );
  if (state.runs.length > 1) {
    const other = runId === 0 ? 1 : 0;
    nav.append(link("Compare", `#/compare?a=${runId}&b=${other}`, page === "compare"));
  }
  showLive(page === "compare" ? null : state.runs[runId]);
}

// One event stream for the run on screen; every update goes to the current view.
function listen(runId) {
  if (state.sourceRun === runId && state.source) return;
  if (state.source) state.source.close();
  state.source = null;
  state.sourceRun = runId;
  if (runId === null) return;
  const source = new EventSource(`/api/runs/${runId}/events`);
  source.addEventListener("update", (event) => {
    const info = JSON.parse(event.data);
    state.runs[runId] = { ...state.runs[runId], ...info };
    showLive(state.runs[runId]);
    if (info.runs_version !== undefined && info.runs_version !== state.runsVersion) loadRuns();
    if (state.view && state.view.update) state.view.update(info);
    else state.missed = true;
  });
  source.onerror = () => showLive(state.runs[runId], true);
  state.source = source;
}

function showLive(run, broken) {
  const el = clear(document.getElementById("live"));
  if (!run) return;
  const status = run.status || {};
  const done = (status.finished || 0) + (status.failed || 0);
  const labels = {
    live: "live",
    finished: "finished",
    interrupted: "interrupted",
    unknown: run.kind === "tree" ? "episode folders" : "status unknown",
  };
  el.className = `live live-${broken ? "broken" : run.state}`;
  el.dataset.state = run.state;
  const resumed = (run.resumed_at || []).length;
  const notes = [`run state: ${run.state}`];
  if (resumed) notes.push(`resumed ${resumed} time${resumed > 1 ? "s" : ""}, last at ${run.resumed_at[resumed - 1]}`);
  if (run.unreadable_lines) notes.push(`${run.unreadable_lines} unreadable line(s) in results.jsonl`);
  el.title = broken ? "lost the connection to the viewer; retrying" : notes.join("; ");
  el.append(h("span", { class: "dot" }), labels[run.state] || run.state);
  const parts = [`${num(done)}/${num(run.episodes)} done`];
  if (status.running) parts.push(`${num(status.running)} running`);
  if (status.queued) parts.push(`${num(status.queued)} queued`);
  if (resumed) parts.push(`resumed ×${resumed}`);
  el.append(h("span", { class: "muted" }, " · " + parts.join(" · ")));
}

// A run started in a folder of runs: the picker offers it. Were the run on screen an empty
// folder of runs that the new run took the place of, the page shows the new run.
async function loadRuns() {
  const listed = await api("/api/runs");
  const { runId, page } = where();
  const before = state.runs[runId];
  state.runs = listed.runs;
  state.runsVersion = listed.runs_version;
  const after = state.runs[runId];
  if (!before || !after || before.root !== after.root) {
    if (state.source) state.source.close();
    state.source = null;
    route();
  } else {
    header(runId, page);
  }
}

async function start() {
  try {
    const listed = await api("/api/runs");
    state.runs = listed.runs;
    state.runsVersion = listed.runs_version;
    setInfraExits(listed.infra_exits);
  } catch (err) {
    clear(document.getElementById("view")).append(h("div", { class: "error pad" }, err.message));
    return;
  }
  window.addEventListener("hashchange", route);
  route();
}

start();
