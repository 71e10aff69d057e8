// The review list of rated answers (GET /api/feedback, gateway/feedback.py), newest first: the question, the
// answer (folded, opens in place), the thumb with its reason and comment, the indexes, the documents cited, the
// steps, and when. Filters by index, rating and a date window; "Older ratings" pages on; "Export JSON lines"
// downloads /api/feedback/export with the same filters (the raw material for an evaluation set).
//
// The gateway decides what a caller sees (an administrator every rating, an index owner those on their indexes),
// so one panel serves both: the Admin area's "Ratings" tab, and the owner's page `#/ratings/<index id>`, reached
// from the index page (RatingsView below).

import { api } from "../api.js";
import { h, icon, mount, relativeTime } from "../dom.js";
import { registerAdminTab } from "./admin.js";
import { REASONS } from "./feedback.js";
import { formatDate, t } from "../i18n.js";

const PAGE = 25;
const SHORT = 280;

/** A `<input type=date>` value as the ISO instant that starts (or, with `end`, ends) that local day. */
function dayBound(value, end) {
  if (!value) return "";
  const day = new Date(`${value}T${end ? "23:59:59.999" : "00:00:00"}`);
  return Number.isNaN(day.getTime()) ? "" : day.toISOString();
}

function place(doc) {
  const where = doc.location || {};
  if (where.sheet) {
    const rows = Array.isArray(where.rows) ? `, ${t("rows {from}–{to}", { from: where.rows[0], to: where.rows[1] })}` : "";
    return t("Sheet '{sheet}'{rows}", { sheet: where.sheet, rows });
  }
  return typeof doc.page === "number" ? t("p. {page}", { page: doc.page }) : "";
}

function answerBlock(text) {
  const answer = text || "";
  if (answer.length <= SHORT) return h("p", { class: "rating-answer", text: answer || "(empty answer)" });
  return h(
    "details",
    { class: "rating-answer" },
    h(
      "summary",
      {},
      h("span", { class: "rating-preview", text: `${answer.slice(0, SHORT).trimEnd()}…` }),
      h("span", { class: "rating-less muted small", text: t("Show less") }),
    ),
    h("p", { class: "rating-answer-full", text: answer }),
  );
}

function ratingItem(item, indexNames) {
  const up = item.rating === "up";
  const indexes = (item.index_ids || []).map((id) => indexNames.get(id) || t("index {id}", { id }));
  const docs = item.documents || [];
  const steps = (item.steps || []).filter((s) => s && (s.label || s.step));
  return h(
    "article",
    { class: "card rating-item", dataset: { rating: item.rating, feedbackId: String(item.id) } },
    h(
      "div",
      { class: "rating-head" },
      h("span", {
        class: `rating-thumb ${up ? "up" : "down"}`,
        role: "img",
        "aria-label": up ? t("Rated good") : t("Rated bad"),
        title: up ? t("Rated good") : t("Rated bad"),
      }, icon(up ? "thumbsUp" : "thumbsDown"), up ? " Good" : " Bad"),
      item.reason ? h("span", { class: "rating-reason", text: REASONS[item.reason] || item.reason }) : null,
      h("span", { class: "muted small rating-who", text: item.user ? t("by {user}", { user: item.user }) : "" }),
      indexes.length ? h("span", { class: "muted small rating-indexes", text: indexes.join(", ") }) : null,
      h("time", { class: "muted small rating-when", datetime: item.updated_at || "", title: item.updated_at ? formatDate(item.updated_at, { time: true }) : "", text: relativeTime(item.updated_at) }),
    ),
    h("p", { class: "rating-question", text: item.question || "(no question stored)" }),
    item.comment ? h("blockquote", { class: "rating-comment", text: item.comment }) : null,
    answerBlock(item.answer),
    docs.length
      ? h(
          "ul",
          { class: "rating-docs", role: "list", "aria-label": t("Documents cited") },
          docs.map((d) =>
            h(
              "li",
              {},
              d.ref ? h("span", { class: "rating-ref", text: `[${d.ref}]` }) : null,
              h("span", { text: ` ${d.filename || "?"}` }),
              place(d) ? h("span", { class: "muted", text: ` — ${place(d)}` }) : null,
            ),
          ),
        )
      : h("p", { class: "muted small", text: t("No documents cited.") }),
    steps.length
      ? h(
          "details",
          { class: "rating-steps" },
          h("summary", { class: "muted small", text: `${t("{count} steps", { count: steps.length })}${item.model ? ` · ${item.model}` : ""}` }),
          h("ol", {}, steps.map((s) => h("li", { text: s.label || s.step }))),
        )
      : null,
  );
}

/**
 * Fills `root` with the filters and the list. `indexId` preselects an index (the owner's page). Nothing to
 * clean up: each request writes only into elements of this panel.
 */
export function renderRatings(root, { indexId = null } = {}) {
  const index = h("select", { class: "input", id: "ratings-index", "aria-label": t("Index") }, h("option", { value: "", text: t("All indexes") }));
  const rating = h(
    "select",
    { class: "input", id: "ratings-rating", "aria-label": t("Rating") },
    h("option", { value: "", text: t("Up and down") }),
    h("option", { value: "up", text: t("👍 Good") }),
    h("option", { value: "down", text: t("👎 Bad") }),
  );
  const since = h("input", { class: "input", id: "ratings-since", type: "date", "aria-label": t("From") });
  const until = h("input", { class: "input", id: "ratings-until", type: "date", "aria-label": t("To") });
  const exportButton = h("button", { class: "button ghost ratings-export", type: "button" }, icon("download"), h("span", { text: t("Export JSON lines") }));
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const list = h("div", { class: "rating-list", "aria-live": "polite" }, h("p", { class: "muted", text: t("Loading…") }));
  const more = h("button", { class: "button ghost", type: "button", hidden: true, text: t("Older ratings") });
  const indexNames = new Map();
  let offset = 0;
  let generation = 0;

  const filters = () => ({
    index_id: index.value,
    rating: rating.value,
    since: dayBound(since.value, false),
    until: dayBound(until.value, true),
  });
  const fail = (err) => {
    error.textContent = err.message;
    error.hidden = false;
  };

  const load = async (reset) => {
    error.hidden = true;
    if (reset) offset = 0;
    const mine = ++generation; // a slower answer to an older filter never overwrites a newer one
    let page;
    try {
      page = await api.listFeedback({ ...filters(), limit: PAGE, offset });
    } catch (err) {
      if (mine !== generation) return;
      if (reset) mount(list);
      more.hidden = true;
      fail(err);
      return;
    }
    if (mine !== generation) return;
    const items = page.items || [];
    if (reset) mount(list);
    list.append(...items.map((item) => ratingItem(item, indexNames)));
    if (!list.children.length) {
      const filtered = Object.values(filters()).some(Boolean);
      list.append(h("p", { class: "muted rating-empty", text: filtered ? t("No ratings match these filters.") : t("No answers rated yet.") }));
    }
    offset += items.length;
    more.hidden = !page.more;
  };

  exportButton.addEventListener("click", async () => {
    error.hidden = true;
    try {
      const response = await api.exportFeedback(filters());
      const blob = await response.blob();
      const name = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "")?.[1] || "feedback.jsonl";
      const url = URL.createObjectURL(blob);
      const link = h("a", { href: url, download: name, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (err) {
      fail(err);
    }
  });
  for (const control of [index, rating, since, until]) control.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));

  mount(
    root,
    h(
      "div",
      { class: "audit-filters ratings-filters" },
      h("label", { class: "field inline", for: "ratings-index" }, h("span", { text: t("Index") }), index),
      h("label", { class: "field inline", for: "ratings-rating" }, h("span", { text: t("Rating") }), rating),
      h("label", { class: "field inline", for: "ratings-since" }, h("span", { text: t("From") }), since),
      h("label", { class: "field inline", for: "ratings-until" }, h("span", { text: t("To") }), until),
      exportButton,
    ),
    error,
    list,
    more,
    h("p", { class: "hint muted", text: t("Newest first. The export has every rating these filters select, one JSON object a line, with the answer's documents and steps.") }),
  );

  // The index names for the filter and the cards first (a failure leaves ids as labels), then the list.
  api
    .listIndexes()
    .then((indexes) => {
      for (const i of indexes) {
        indexNames.set(i.id, i.name);
        const label = i.owner && i.via && i.via !== "owner" ? `${i.name} (${i.owner})` : i.name;
        index.append(h("option", { value: String(i.id), text: label }));
      }
    })
    .catch(() => {})
    .then(() => {
      if (indexId !== null) {
        if (!indexNames.has(indexId)) index.append(h("option", { value: String(indexId), text: t("index {indexId}", { indexId }) }));
        index.value = String(indexId);
      }
      load(true);
    });
}

/** `#/ratings/<index id>`: the review list of one index, for its owner (who may not be an administrator). */
export class RatingsView {
  constructor(shell, indexId) {
    this.indexId = indexId && /^\d+$/.test(indexId) ? Number(indexId) : null;
    this.body = h("div", { class: "page-body tab-panel" });
    this.element = h(
      "section",
      { class: "page ratings-view", "aria-labelledby": "ratings-title" },
      shell.header(
        h("h1", { class: "topbar-title", id: "ratings-title", text: t("Ratings") }),
        this.indexId !== null ? h("a", { class: "button ghost", href: `#/documents/${this.indexId}`, text: t("Back to the index") }) : null,
      ),
      this.body,
    );
  }

  start() {
    document.title = t("Ratings · RAG Chat");
    renderRatings(this.body, { indexId: this.indexId });
  }
}

registerAdminTab({
  id: "ratings",
  label: t("Ratings"),
  render: (root) => {
    renderRatings(root);
  },
});
