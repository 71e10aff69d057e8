// Light/dark: the system preference by default; the toggle pins a choice in localStorage.

const media = window.matchMedia("(prefers-color-scheme: dark)");

export function currentTheme() {
  const pinned = document.documentElement.dataset.theme;
  if (pinned === "light" || pinned === "dark") return pinned;
  return media.matches ? "dark" : "light";
}

export function toggleTheme() {
  const next = currentTheme() === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  try {
    localStorage.setItem("theme", next);
  } catch {
    /* storage blocked: the choice lasts for this page only */
  }
  return next;
}

/** Calls `listener(theme)` when the effective theme changes by the system or by the toggle. */
export function onThemeChange(listener) {
  media.addEventListener("change", () => listener(currentTheme()));
}
