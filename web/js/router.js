// Hash routes ("#/chats/12"): the gateway serves one index.html at "/", so no server-side fallback is needed.

let handler = () => {};

/** Registers the function that renders the current route. */
export function onRoute(fn) {
  handler = fn;
}

export function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const [name = "chats", id = null] = parts;
  return { name, id };
}

/** Goes to `hash`, re-rendering even when it is already the current one. */
export function navigate(hash) {
  if (location.hash === hash) handler();
  else location.hash = hash;
}

/** Changes the address without re-rendering, for a view that already shows what the new hash names. */
export function replaceRoute(hash) {
  history.replaceState(null, "", hash);
}

window.addEventListener("hashchange", () => {
  // Only "#/..." hashes are routes; other in-page anchors are left to their views.
  if (location.hash === "" || location.hash.startsWith("#/")) handler();
});
