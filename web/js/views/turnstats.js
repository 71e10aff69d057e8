// Turn statistics for administrators, from the gateway's step log (GET /api/admin/turn-stats): each turn's
// first-token latency over the chosen window as a time chart, and the median duration of each stage as bars.
// Both charts are inline SVG drawn here (no chart library); a screen reader gets each chart's summary.
//
// `renderTurnStats(root)` fills any element; this module registers it as the Admin area's "Statistics" tab.

import { api } from "../api.js";
import { h, mount } from "../dom.js";
import { registerAdminTab } from "./admin.js";
import { formatDate, t } from "../i18n.js";

const SVG = "http://www.w3.org/2000/svg";
const WINDOWS = [
  [24, t("Last day")],
  [24 * 7, t("Last week")],
  [24 * 30, t("Last 30 days")],
];
// The turn's own clocks are rows of the step log too; the bars show stages only.
const CLOCKS = new Set(["first_token", "total"]);
const STAGE_NAMES = {
  rewriting: t("Rewrite"),
  triage: t("Triage"),
  fetch_check: t("Fetch check"),
  hyde: t("HyDE"),
  retrieving: t("Retrieve"),
  reranking: t("Rerank"),
  evaluating: t("Relevance"),
  retrying: t("Retry"),
  expanding: t("Expand"),
  sql: "SQL",
  queued: t("Queue"),
  generating: t("Generate"),
  grounding: t("Grounding"),
  verifying: t("Citations"),
  provenance: t("Provenance"),
};

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  for (const child of children) if (child) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

export function formatMs(ms) {
  if (ms >= 10000) return `${(ms / 1000).toFixed(0)} s`;
  if (ms >= 1000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms)} ms`;
}

/** A round axis maximum at or above `max` (1, 2 or 5 times a power of ten). */
export function niceMax(max) {
  if (!(max > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}

/** First-token latency of each turn against time: points, a line through them, a y axis in ms. */
export function latencyChart(points, since, until) {
  const width = 640;
  const height = 220;
  const pad = { left: 56, right: 12, top: 12, bottom: 28 };
  const t0 = Date.parse(since);
  const t1 = Math.max(Date.parse(until), t0 + 1);
  const yMax = niceMax(Math.max(...points.map((p) => p.ms), 1));
  const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * (width - pad.left - pad.right);
  const y = (ms) => height - pad.bottom - (ms / yMax) * (height - pad.top - pad.bottom);
  const sorted = [...points].sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
  const ms = sorted.map((p) => p.ms).sort((a, b) => a - b);
  const median = ms.length ? (ms[(ms.length - 1) >> 1] + ms[ms.length >> 1]) / 2 : 0;
  const summary = ms.length
    ? t("First-token latency of {count} turns: median {median}, slowest {slowest}.", { count: ms.length, median: formatMs(median), slowest: formatMs(ms[ms.length - 1]) })
    : t("No turns in this window.");
  const chart = svg(
    "svg",
    { class: "stats-chart latency-chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": summary },
    svg("title", {}, summary),
  );
  for (const fraction of [0, 0.5, 1]) {
    const value = yMax * fraction;
    chart.append(
      svg("line", { class: "grid", x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value) }),
      svg("text", { class: "axis-label", x: pad.left - 6, y: y(value) + 4, "text-anchor": "end" }, formatMs(value)),
    );
  }
  const hours = (t1 - t0) / 3600000;
  const left = hours <= 48 ? t("{count} h ago", { count: Math.round(hours) }) : t("{count} days ago", { count: Math.round(hours / 24) });
  chart.append(
    svg("text", { class: "axis-label", x: pad.left, y: height - 8 }, left),
    svg("text", { class: "axis-label", x: width - pad.right, y: height - 8, "text-anchor": "end" }, "now"),
  );
  if (sorted.length > 1) {
    const d = sorted.map((p, i) => `${i ? "L" : "M"}${x(Date.parse(p.at)).toFixed(1)},${y(p.ms).toFixed(1)}`).join("");
    chart.append(svg("path", { class: "series", d }));
  }
  if (ms.length) chart.append(svg("line", { class: "median", x1: pad.left, x2: width - pad.right, y1: y(median), y2: y(median) }));
  for (const p of sorted) {
    chart.append(
      svg(
        "circle",
        { class: `point route-${p.route || "rag"}`, cx: x(Date.parse(p.at)).toFixed(1), cy: y(p.ms).toFixed(1), r: 3 },
        svg("title", {}, `${formatDate(p.at, { time: true })}: ${formatMs(p.ms)} (${p.route || "rag"})`),
      ),
    );
  }
  return chart;
}

/** The median duration of each stage, slowest first, as horizontal bars. */
export function stageChart(stages) {
  const rows = stages.filter((s) => !CLOCKS.has(s.step));
  const width = 640;
  const bar = 22;
  const gap = 8;
  const labelWidth = 110;
  const valueWidth = 70;
  const height = Math.max(rows.length, 1) * (bar + gap) + gap;
  const max = niceMax(Math.max(...rows.map((s) => s.median_ms), 1));
  const scale = (ms) => (ms / max) * (width - labelWidth - valueWidth);
  const summary = rows.length
    ? t("Median duration per stage: {stages}.", { stages: rows.map((s) => `${STAGE_NAMES[s.step] || s.step} ${formatMs(s.median_ms)}`).join(", ") })
    : t("No stages logged in this window.");
  const chart = svg(
    "svg",
    { class: "stats-chart stage-chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": summary },
    svg("title", {}, summary),
  );
  rows.forEach((s, i) => {
    const top = gap + i * (bar + gap);
    const name = STAGE_NAMES[s.step] || s.step;
    chart.append(
      svg("text", { class: "axis-label", x: labelWidth - 8, y: top + bar / 2 + 4, "text-anchor": "end" }, name),
      svg(
        "rect",
        { class: "bar", x: labelWidth, y: top, width: Math.max(scale(s.median_ms), 1).toFixed(1), height: bar, rx: 3 },
        svg("title", {}, t("{name}: median {median} over {count} turns", { name, median: formatMs(s.median_ms), count: s.turns })),
      ),
      svg("text", { class: "value-label", x: labelWidth + scale(s.median_ms) + 6, y: top + bar / 2 + 4 }, formatMs(s.median_ms)),
    );
  });
  return chart;
}

/** Fills `root` with the window picker and both charts; returns a function that reloads them. */
export function renderTurnStats(root) {
  const select = h(
    "select",
    { id: "stats-window", onchange: () => load() },
    WINDOWS.map(([hours, label]) => h("option", { value: String(hours), text: label })),
  );
  const first = h("div", { class: "stats-figure" }, h("p", { class: "muted", text: t("Loading…") }));
  const stages = h("div", { class: "stats-figure" });
  mount(
    root,
    h("div", { class: "stats-controls" }, h("label", { for: "stats-window", text: t("Window") }), select),
    h("h2", { class: "stats-heading", text: t("Time to first token") }),
    first,
    h("h2", { class: "stats-heading", text: t("Median time per stage") }),
    stages,
  );
  async function load() {
    let data;
    try {
      data = await api.turnStats(Number(select.value));
    } catch (err) {
      mount(first, h("p", { class: "form-error", role: "alert", text: err.message }));
      mount(stages);
      return;
    }
    const turns = data.first_tokens.length;
    mount(
      first,
      latencyChart(data.first_tokens, data.since, new Date().toISOString()),
      h("p", { class: "muted stats-note", text: t("{count} turns answered in this window.", { count: turns }) }),
    );
    mount(stages, stageChart(data.stages));
  }
  load();
  return load;
}

// The Admin area's "Statistics" tab (the reload function renderTurnStats returns is not a cleanup).
registerAdminTab({
  id: "stats",
  label: t("Statistics"),
  render: (root) => {
    renderTurnStats(root);
  },
});
