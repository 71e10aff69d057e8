// One assistant message: the live step list, the document cards, the growing markdown answer, and its
// end state (done, stopped, interrupted, failed). Used both for a live turn and for a stored one.

import { errorText } from "../api.js";
import { announce, formatSeconds, h, icon } from "../dom.js";
import { groundingBadge, groundingBanner, markUnsupported } from "../grounding.js";
import { linkCitations, renderMarkdown, snippet } from "../markdown.js";
import { placeLabel } from "./source_viewer.js";
import { formatNumber, t } from "../i18n.js";

let turnCounter = 0;

const STEP_NAMES = {
  fetch_check: t("Checking earlier sources"),
  rewriting: t("Rewriting the question"),
  triage: t("Deciding how to answer"),
  hyde: t("Drafting a search passage"),
  retrieving: t("Searching documents"),
  reranking: t("Ranking passages"),
  evaluating: t("Checking relevance"),
  retrying: t("Searching again"),
  expanding: t("Adding context"),
  generating: t("Writing the answer"),
  provenance: t("Measuring source use"),
  verifying: t("Checking citations"),
  sql: t("Computing over tables"),
  grounding: t("Checking the answer against the sources"),
};

const ROUTE_NAMES = { rag: t("Search your documents"), direct: t("Answer directly"), sql: t("Compute over tables") };

/** The user's message: plain text, never markup. */
export function renderUserMessage(text) {
  return h(
    "article",
    { class: "message user", "aria-label": t("You said") },
    h("div", { class: "bubble" }, h("p", { class: "user-text", text })),
  );
}

export class AssistantMessage {
  constructor({ chatId = null } = {}) {
    this.key = `t${++turnCounter}`;
    this.chatId = chatId;
    this.messageId = null; // known once the answer is stored (the stream's `saved`, or a loaded message)
    this.text = "";
    this.documents = [];
    this.steps = [];
    this.state = "streaming";
    this.renderScheduled = false;
    this.grounding = null;

    this.stepList = h("ol", { class: "step-list" });
    this.stepSummary = h("span", { class: "steps-summary-text", text: t("Working…") });
    this.stepsBox = h(
      "details",
      { class: "steps", open: true },
      h("summary", {}, h("span", { class: "spinner", "aria-hidden": "true" }), this.stepSummary),
      this.stepList,
    );
    this.rewritten = h("p", { class: "rewritten-notice", hidden: true });
    this.cards = h("ol", { class: "doc-cards", role: "list" });
    this.sources = h(
      "section",
      { class: "sources", hidden: true, "aria-label": t("Sources") },
      h("h3", { class: "sources-title", text: t("Sources") }),
      this.cards,
    );
    this.answer = h("div", { class: "answer markdown" });
    this.status = h("p", { class: "turn-status", hidden: true });
    this.groundingNote = h("p", { class: "grounding-note", role: "note", hidden: true });
    this.meta = h("p", { class: "turn-meta muted", hidden: true });
    this.feedbackSlot = h("div", { class: "feedback-slot" }); // feedback.js fills it for a stored answer
    this.element = h(
      "article",
      { class: "message assistant streaming", "aria-label": t("Answer"), "aria-busy": "true", dataset: { turn: this.key } },
      h("div", { class: "bot-mark", "aria-hidden": "true", text: "◆" }),
      h(
        "div",
        { class: "message-body" },
        this.stepsBox,
        this.rewritten,
        this.sources,
        this.groundingNote,
        this.answer,
        this.status,
        this.meta,
        this.feedbackSlot,
      ),
    );
    this.element.addEventListener("click", (event) => this.onCitationClick(event));
  }

  // ---- live events -------------------------------------------------------------------------------

  addRoute({ route, reason }) {
    const name = ROUTE_NAMES[route] || t("Route: {route}", { route });
    this.pushStep({ step: "route", label: name, detail: reason || "", elapsed_ms: null, kind: "route" });
  }

  addStep({ step, label, elapsed_ms }) {
    // The worker announces a stage as it starts and again with its outcome ("Searching for: …"):
    // the second event updates the stage's line instead of adding one.
    const last = this.steps.at(-1);
    if (last && last.kind === "step" && last.step === step && last.item.classList.contains("running")) {
      if (label && label !== last.label) {
        last.detailEl.textContent = label;
        last.detailEl.hidden = false;
      }
      return;
    }
    this.pushStep({ step, label: label || STEP_NAMES[step] || step, elapsed_ms, kind: "step" });
  }

  pushStep(step) {
    const previous = this.steps.at(-1);
    if (previous) this.closeStep(previous, step.elapsed_ms);
    const time = h("span", { class: "step-time" });
    const detailEl = h("span", { class: "step-detail", text: step.detail || "", hidden: !step.detail });
    const item = h(
      "li",
      { class: `step running ${step.kind}`, dataset: { step: step.step } },
      h("span", { class: "step-icon", "aria-hidden": "true" }),
      h("span", { class: "step-text" }, h("span", { class: "step-label", text: step.label }), detailEl),
      time,
    );
    if (typeof step.elapsed_ms === "number") time.textContent = `at ${formatSeconds(step.elapsed_ms)}`;
    this.steps.push({ ...step, item, time, detailEl });
    this.stepList.append(item);
    if (this.state === "streaming") this.stepSummary.textContent = `${step.label}…`;
  }

  /** A step ends when the next starts (or the turn ends): show how long it took. */
  closeStep(step, endMs) {
    step.item.classList.remove("running");
    step.item.classList.add("finished");
    if (typeof step.elapsed_ms === "number" && typeof endMs === "number" && endMs >= step.elapsed_ms) {
      step.time.textContent = formatSeconds(endMs - step.elapsed_ms);
      step.time.title = t("started at {time}", { time: formatSeconds(step.elapsed_ms) });
    }
  }

  setDocuments(documents) {
    // Keep the documents already shown if a later event carries none (they stay valid for this turn).
    if (!Array.isArray(documents) || (!documents.length && this.documents.length)) return;
    this.documents = documents.map((doc, i) => ({ ...doc, ref: doc.ref || `S${i + 1}`, rank: i + 1 }));
    this.renderCards();
  }

  appendToken(token) {
    this.text += token;
    if (this.renderScheduled) return;
    this.renderScheduled = true;
    // One render per frame however fast tokens come.
    requestAnimationFrame(() => {
      this.renderScheduled = false;
      this.renderAnswer();
    });
  }

  /**
   * A finished answer, one shape wherever it comes from (contract/answer.py's `Answer`): the stream's `done`,
   * a rejoined turn's, or a stored message's `answer`. Its reply replaces the streamed text (citations
   * corrected, or quotes instead of an ungrounded draft); its documents now carry provenance.
   */
  finish(answer, { quiet = false } = {}) {
    this.state = "done";
    this.text = answer.reply;
    this.grounding = answer.grounding || null;
    this.setDocuments(answer.documents);
    this.renderAnswer();
    this.showRewritten(answer.question, answer.rewritten);
    const totalMs = answer.timings?.total_ms;
    this.endSteps(totalMs);
    const parts = [];
    if (answer.model) parts.push(answer.model);
    if (typeof totalMs === "number") parts.push(formatSeconds(totalMs));
    if (answer.abstained) parts.push(t("not enough evidence to answer"));
    this.showMeta(parts);
    this.showGrounding();
    this.settle();
    if (!quiet) announce(t("Answer: {text}", { text: this.answer.textContent.slice(0, 400) }));
  }

  /** The worker reported an error: keep what arrived, say what went wrong. */
  fail(error, { quiet = false } = {}) {
    const message = errorText(error, t("The answer could not be completed."));
    this.state = this.text ? "interrupted" : "failed";
    this.endSteps(null);
    this.renderAnswer();
    this.showStatus(this.text ? t("Interrupted: {message}", { message }) : message, "error");
    this.settle();
    if (!quiet) announce(this.text ? t("The answer was interrupted: {message}", { message }) : t("Error: {message}", { message }));
  }

  /** The stream ended without `done` or `error` (connection lost), or the user pressed stop. */
  interrupt(stopped, { quiet = false, reason = "" } = {}) {
    this.state = stopped ? "stopped" : "interrupted";
    this.endSteps(null);
    this.renderAnswer();
    const text = stopped
      ? t("Stopped. The answer is incomplete.")
      : reason
        ? t("Interrupted: {message}", { message: reason })
        : t("Connection lost. The answer is incomplete.");
    this.showStatus(text, stopped ? "stopped" : "error");
    this.settle();
    if (!quiet) announce(stopped ? t("Answer stopped") : t("The connection was lost; the answer is incomplete."));
  }

  /** A rejoined turn's `snapshot`: what happened before this page was listening; the turn goes on. */
  applySnapshot(snapshot) {
    if (snapshot.route?.route) this.addRoute(snapshot.route);
    for (const step of snapshot.steps || []) this.addStep(step);
    if (Array.isArray(snapshot.documents)) this.setDocuments(snapshot.documents);
    this.text = snapshot.answer || "";
    this.renderAnswer();
    if (snapshot.done) this.finish(snapshot.done);
  }

  // ---- a stored message (GET /api/chats/{id}) ----------------------------------------------------

  /** A stored message: its steps, then its answer if it finished, else what it had and how it ended. */
  load(message) {
    this.messageId = message.id ?? null;
    // The layer-1 gate's decision is stored as `gate`; the worker's steps as `steps`.
    if (message.gate?.route) this.addRoute(message.gate);
    for (const step of message.steps) this.addStep(step);
    if (message.answer) {
      this.finish(message.answer, { quiet: true });
    } else {
      this.setDocuments(message.documents);
      this.text = message.content;
      if (message.status === "failed") this.fail({ error: message.error }, { quiet: true });
      else if (message.details.stopped) this.interrupt(true, { quiet: true });
      else this.interrupt(false, { quiet: true, reason: message.error });
    }
    this.stepsBox.open = false;
  }

  // ---- rendering ---------------------------------------------------------------------------------

  renderAnswer() {
    const fragment = renderMarkdown(this.text);
    if (this.state === "done") markUnsupported(fragment, this.grounding);
    linkCitations(fragment, (ref) => this.citationLink(ref));
    this.answer.replaceChildren(fragment);
  }

  citationLink(ref) {
    const doc = this.documents.find((d) => d.ref === ref);
    if (!doc) return null;
    return h(
      "a",
      {
        class: "cite",
        href: `#card-${this.key}-${ref}`,
        dataset: { ref },
        "aria-label": t("Source {ref}: {filename}", { ref, filename: doc.filename || t("document") }),
        title: doc.filename || ref,
      },
      ref,
    );
  }

  onCitationClick(event) {
    const opener = event.target.closest("button.open-source");
    if (opener) {
      this.openSource(opener.dataset.ref);
      return;
    }
    const link = event.target.closest("a.cite");
    if (!link) return;
    event.preventDefault(); // the hash is the route; a citation only moves within the page
    const card = this.cards.querySelector(`[data-ref="${CSS.escape(link.dataset.ref)}"]`);
    if (!card) return;
    for (const other of document.querySelectorAll(".doc-card.highlighted")) other.classList.remove("highlighted");
    card.classList.add("highlighted");
    card.scrollIntoView({ behavior: "smooth", block: "nearest", inline: "nearest" });
    card.focus({ preventScroll: true });
    if (card.dataset.kind !== "table") this.openSource(link.dataset.ref);
  }

  /** Asks the chat view to open source `ref` in its viewer (source_viewer.js). */
  openSource(ref) {
    const doc = this.documents.find((d) => d.ref === ref);
    if (!doc || doc.kind === "table") return;
    const detail = { chatId: this.chatId, messageId: this.messageId, ref, doc };
    this.element.dispatchEvent(new CustomEvent("open-source", { detail, bubbles: true }));
  }

  renderCards() {
    this.sources.hidden = !this.documents.length;
    this.cards.replaceChildren(...this.documents.map((doc) => this.renderCard(doc)));
  }

  renderCard(doc) {
    if (doc.kind === "table") return this.renderTableCard(doc);
    const place = [doc.dataset, placeLabel(doc) || null].filter(Boolean).join(" · ");
    const score = typeof doc.rerank_score === "number" ? doc.rerank_score : doc.score;
    const parts = [t("retrieved #{rank}", { rank: doc.rank })];
    let bar = null;
    if (typeof doc.provenance === "number" && this.state === "done") {
      const pct = Math.round(Math.max(0, Math.min(1, doc.provenance)) * 100);
      parts.push(t("used {percent}", { percent: formatNumber(pct / 100, { style: "percent" }) }));
      bar = h("span", { class: "used-bar", "aria-hidden": "true" }, h("span", { style: `width: ${pct}%` }));
    } else if (typeof score === "number") {
      parts.push(t("score {score}", { score: score.toFixed(Math.abs(score) < 0.1 ? 3 : 2) }));
    }
    const scores = [h("span", { class: "score-text", text: parts.join(" · ") }), bar];
    const title = [
      typeof doc.score === "number" ? t("retrieval score {score}", { score: doc.score.toFixed(4) }) : null,
      typeof doc.rerank_score === "number" ? t("rerank score {score}", { score: doc.rerank_score.toFixed(3) }) : null,
      typeof doc.provenance === "number" ? t("provenance {score}", { score: doc.provenance.toFixed(3) }) : null,
    ].filter(Boolean).join(", ");
    const text = snippet(doc.text);
    return h(
      "li",
      {
        class: "doc-card",
        id: `card-${this.key}-${doc.ref}`,
        tabindex: "-1",
        dataset: { ref: doc.ref },
        "aria-label": t("Source {ref}: {filename}", { ref: doc.ref, filename: doc.filename || t("document") }),
      },
      h(
        "div",
        { class: "doc-head" },
        h("span", { class: "ref-badge", text: doc.ref }),
        h("span", { class: "doc-name", text: doc.filename || "document", title: doc.filename || "" }),
        h("button", {
          class: "button ghost open-source",
          type: "button",
          dataset: { ref: doc.ref },
          "aria-label": t("Open source {ref} beside the answer", { ref: doc.ref }),
          title: t("Open the source at this passage"),
          text: t("Open"),
        }),
      ),
      place ? h("p", { class: "doc-place muted", text: place }) : null,
      h("p", { class: "doc-scores", title }, ...scores),
      text ? h("p", { class: "doc-snippet", text }) : null,
    );
  }

  /** A computed result (the `sql` route): the query and the rows it returned, as text only. */
  renderTableCard(doc) {
    const columns = Array.isArray(doc.columns) ? doc.columns : [];
    const rows = Array.isArray(doc.rows) ? doc.rows : [];
    const shown = rows.slice(0, 50);
    const cell = (v) => (v === null || v === undefined ? "" : String(v));
    const table = h(
      "table",
      { class: "result-table" },
      h("thead", {}, h("tr", {}, ...columns.map((c) => h("th", { scope: "col", text: cell(c) })))),
      h("tbody", {}, ...shown.map((row) => h("tr", {}, ...row.map((v) => h("td", { text: cell(v) }))))),
    );
    const count = `${t("{count} rows", { count: rows.length })}${doc.truncated ? ` ${t("(more not shown)")}` : ""}`;
    return h(
      "li",
      {
        class: "doc-card table-card",
        id: `card-${this.key}-${doc.ref}`,
        tabindex: "-1",
        dataset: { ref: doc.ref, kind: "table" },
        "aria-label": t("Source {ref}: query result over {filename}", { ref: doc.ref, filename: doc.filename || t("a table") }),
      },
      h(
        "div",
        { class: "doc-head" },
        h("span", { class: "ref-badge", text: doc.ref }),
        h("span", { class: "doc-name", text: doc.filename || "table", title: doc.filename || "" }),
      ),
      h("p", { class: "doc-place muted", text: t("SQL result · {rows}", { rows: count }) }),
      h("pre", { class: "sql-query" }, h("code", { text: doc.query || "" })),
      h("div", { class: "result-table-wrap" }, table),
    );
  }

  showRewritten(question, rewritten) {
    if (!rewritten || (question && rewritten.trim() === question.trim())) return;
    this.rewritten.replaceChildren(
      icon("edit"),
      h("span", {}, t("Your question was rewritten as: "), h("q", { text: rewritten })),
    );
    this.rewritten.hidden = false;
  }

  showStatus(text, kind) {
    this.status.replaceChildren(icon(kind === "stopped" ? "stop" : "alert"), h("span", { text }));
    this.status.className = `turn-status ${kind}`;
    this.status.hidden = false;
  }

  showGrounding() {
    const badge = groundingBadge(this.grounding);
    if (badge) {
      this.meta.append(this.meta.textContent ? " · " : "", badge);
      this.meta.hidden = false;
    }
    const banner = groundingBanner(this.grounding);
    this.groundingNote.textContent = banner || "";
    this.groundingNote.hidden = !banner;
    this.answer.classList.toggle("extractive", this.grounding?.answer_mode === "extractive");
  }

  showMeta(parts) {
    if (!parts.length) return;
    this.meta.textContent = parts.join(" · ");
    this.meta.hidden = false;
  }

  endSteps(totalMs) {
    const last = this.steps.at(-1);
    if (last && last.item.classList.contains("running")) this.closeStep(last, totalMs);
    for (const step of this.steps) {
      if (step.item.classList.contains("running")) {
        step.item.classList.remove("running");
        step.item.classList.add("finished");
      }
    }
    const count = this.steps.filter((s) => s.kind === "step").length;
    const label =
      this.state === "done"
        ? [typeof totalMs === "number" ? t("Finished in {time}", { time: formatSeconds(totalMs) }) : t("Finished"), count ? t("{count} steps", { count }) : null]
            .filter(Boolean)
            .join(" · ")
        : this.state === "stopped"
          ? t("Stopped")
          : t("Did not finish");
    this.stepSummary.textContent = label;
    if (!this.steps.length) this.stepsBox.hidden = true;
  }

  settle() {
    this.element.classList.remove("streaming");
    this.element.classList.add(`state-${this.state}`);
    this.element.setAttribute("aria-busy", "false");
    this.element.dataset.state = this.state;
    if (this.state === "done") this.renderCards(); // provenance shows only once the turn is done
  }
}
