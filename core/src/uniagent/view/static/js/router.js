// Where the page is: everything lives in the hash, so a URL can be shared and reloaded.

export function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean);
  return { parts, params: new URLSearchParams(query || "") };
}

export function go(path, params) {
  const query = params ? new URLSearchParams(params).toString() : "";
  const target = "#" + path + (query ? "?" + query : "");
  if (location.hash !== target) location.hash = target;
  else window.dispatchEvent(new HashChangeEvent("hashchange"));
}

// Change the query without a new page: filters and tabs update the URL in place.
export function replaceParams(path, params) {
  const query = new URLSearchParams(params).toString();
  history.replaceState(null, "", "#" + path + (query ? "?" + query : ""));
}

export function episodeHref(runId, key, tab) {
  const params = new URLSearchParams({ key });
  if (tab) params.set("tab", tab);
  return `#/r/${runId}/e?${params.toString()}`;
}
