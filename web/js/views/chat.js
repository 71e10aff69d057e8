// A chat: its messages, the composer, the stop button and the document scope. With no id it shows a
// welcome screen and creates the chat on the first message.

import { ApiError, api } from "../api.js";
import { announce, h, icon, mount } from "../dom.js";
import { replaceRoute } from "../router.js";
import { readEvents } from "../sse.js";
import { UNTITLED } from "./chatlist.js";
import { pickScope, scopeLabel } from "./scope.js";
import { attachFeedback } from "./feedback.js";
import { SourceViewer } from "./source_viewer.js";
import { AssistantMessage, renderUserMessage } from "./turn.js";
import { currentLocale, t } from "../i18n.js";

export class ChatView {
  constructor(shell, id) {
    this.shell = shell;
    this.id = id;
    this.chat = null;
    this.indexes = null;
    this.controller = null;
    this.destroyed = false;

    this.title = h("h1", { class: "topbar-title", text: id ? "" : UNTITLED });
    this.scopeButton = h(
      "button",
      { class: "chip-button", type: "button", hidden: true, onclick: () => this.editScope() },
      icon("filter"),
      h("span", { class: "scope-text", text: "" }),
    );
    this.messages = h("div", { class: "messages", role: "log", "aria-label": t("Messages"), "aria-live": "off" });
    this.scroller = h("div", { class: "scroller" }, this.messages);
    this.input = h("textarea", {
      class: "composer-input",
      id: "composer-input",
      rows: 1,
      placeholder: t("Ask about your documents…"),
      "aria-label": t("Message"),
      oninput: () => this.autosize(),
      onkeydown: (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          this.submit();
        }
      },
    });
    this.forceRag = h("input", { type: "checkbox", id: "force-rag" });
    this.sendButton = h("button", { class: "send-button", type: "submit", "aria-label": t("Send"), title: t("Send (Enter)") }, icon("send"));
    this.stopButton = h(
      "button",
      { class: "send-button stop", type: "button", hidden: true, "aria-label": t("Stop answering"), title: t("Stop"), onclick: () => this.stop() },
      icon("stop"),
    );
    this.error = h("p", { class: "form-error composer-error", role: "alert", hidden: true });
    const composer = h(
      "form",
      {
        class: "composer",
        onsubmit: (event) => {
          event.preventDefault();
          this.submit();
        },
      },
      this.error,
      h("div", { class: "composer-box" }, this.input, this.sendButton, this.stopButton),
      h(
        "div",
        { class: "composer-foot" },
        h("label", { class: "toggle", for: "force-rag" }, this.forceRag, h("span", { text: t("Always search documents") })),
        h("span", { class: "muted hint only-wide", text: t("Enter to send · Shift+Enter for a new line") }),
      ),
    );
    this.viewer = new SourceViewer();
    this.exportMenu = h(
      "details",
      { class: "export-menu", hidden: !id },
      h("summary", { class: "export-button", text: t("Export") }),
      h(
        "div",
        { class: "export-items" },
        h("button", { class: "button ghost", type: "button", text: t("Markdown"), onclick: () => this.exportChat("markdown") }),
        h("button", { class: "button ghost", type: "button", text: t("JSON"), onclick: () => this.exportChat("json") }),
      ),
    );
    this.element = h(
      "section",
      { class: "chat-view", "aria-labelledby": "chat-title" },
      shell.header(this.title, this.scopeButton, this.exportMenu),
      this.scroller,
      composer,
      this.viewer.element,
    );
    // A citation or a card asks for its source (turn.js): open it beside the answer.
    this.element.addEventListener("open-source", (event) => {
      this.element.classList.add("source-open");
      this.viewer.open({ ...event.detail, chatId: this.id });
    });
    this.onSourceClosed = () => this.element.classList.remove("source-open");
    document.addEventListener("source-closed", this.onSourceClosed);
    this.title.id = "chat-title";
    this.onChatChanged = (event) => {
      if (this.id && String(event.detail.id) === String(this.id)) this.reloadTitle();
    };
    document.addEventListener("chat-changed", this.onChatChanged);
  }

  async start() {
    // Kept: a message sent before the list arrived waits for it, or its new chat would search no index at all.
    this.indexesLoaded = api.listIndexes().catch(() => []);
    this.indexes = await this.indexesLoaded;
    if (this.destroyed) return;
    if (!this.id) {
      this.renderWelcome();
      this.input.focus();
      return;
    }
    try {
      this.chat = await api.getChat(this.id);
    } catch (err) {
      if (err.status === 404) this.renderMissing();
      else if (err.status !== 401) this.showError(err.message);
      return;
    }
    if (this.destroyed) return;
    this.renderChat();
    this.input.focus();
  }

  destroy() {
    this.destroyed = true;
    document.removeEventListener("chat-changed", this.onChatChanged);
    document.removeEventListener("source-closed", this.onSourceClosed);
    this.viewer.close();
    // Leaving mid-answer: the gateway finishes and stores the turn anyway; stop reading it here.
    this.controller?.abort();
  }

  // ---- rendering ---------------------------------------------------------------------------------

  renderWelcome() {
    document.title = t("New chat · RAG Chat");
    const hasIndexes = this.indexes.length > 0;
    mount(
      this.messages,
      h(
        "div",
        { class: "welcome" },
        h("div", { class: "welcome-mark", "aria-hidden": "true", text: "◆" }),
        h("h2", { text: t("What would you like to know?") }),
        hasIndexes
          ? h("p", { class: "muted", text: t("Answers cite the passages they come from. Click a citation to see its source.") })
          : h(
              "p",
              { class: "muted" },
              t("You have no documents yet. "),
              h("a", { href: "#/documents", text: t("Upload some") }),
              " to ask questions about them, or just chat.",
            ),
      ),
    );
    this.updateScope();
  }

  renderMissing() {
    this.title.textContent = t("Chat not found");
    mount(this.messages, h("div", { class: "welcome" }, h("h2", { text: t("This chat does not exist") }), h("p", {}, h("a", { href: "#/chats", text: t("Start a new chat") }))));
  }

  renderChat({ rejoin = true } = {}) {
    this.setTitle(this.chat.title);
    this.messages.replaceChildren();
    // A turn still running (this page was reloaded, or it runs in another tab) is rejoined, not drawn stored.
    const live = rejoin && this.chat.busy;
    const messages = (this.chat.messages || []).filter((m) => !(live && m.status === "running"));
    this.turns = new Map();
    messages.forEach((message, i) => this.renderStored(message, messages[i + 1]));
    this.loadFeedback();
    this.exportMenu.hidden = false;
    this.updateScope();
    requestAnimationFrame(() => this.scrollToEnd(true));
    if (live) this.rejoin();
  }

  renderStored(message, next) {
    if (message.role === "user") {
      this.messages.append(renderUserMessage(message.content || ""));
      // A turn that failed before any token stores only the user message, with the error.
      if (message.error && next?.role !== "assistant") {
        const turn = new AssistantMessage({ chatId: this.id });
        if (message.gate) turn.addRoute(message.gate);
        turn.fail({ error: message.error }, { quiet: true });
        this.messages.append(turn.element);
      }
    } else if (message.role === "assistant") {
      const turn = new AssistantMessage({ chatId: this.id });
      turn.load(message);
      this.turns?.set(String(message.id), turn);
      this.messages.append(turn.element);
    }
  }

  setTitle(title) {
    this.title.textContent = title || UNTITLED;
    document.title = t("{title} · RAG Chat", { title: title || UNTITLED });
  }

  async reloadTitle() {
    try {
      this.chat = { ...this.chat, ...(await api.getChat(this.id)) };
      this.setTitle(this.chat.title);
    } catch {
      /* the list shows the new title either way */
    }
  }

  // Before the first message there is no chat yet: a scope picked now is kept in `pendingScope`, and a new
  // chat searches all of the user's indexes unless told otherwise.
  chatIndexIds() {
    if (this.chat) return this.chat.index_ids || [];
    if (this.pendingScope) return this.pendingScope.index_ids;
    return (this.indexes || []).filter((index) => index.via !== "admin").map((index) => index.id);
  }

  chatDatasets() {
    if (this.chat) return this.chat.datasets || this.chat.state?.datasets || [];
    return this.pendingScope?.datasets || [];
  }

  updateScope() {
    this.scopeButton.hidden = false;
    const label = scopeLabel(this.chatIndexIds(), this.chatDatasets(), this.indexes);
    this.scopeButton.querySelector(".scope-text").textContent = label;
    this.scopeButton.setAttribute("aria-label", t("Documents searched: {label}. Change", { label }));
  }

  async editScope() {
    const chosen = await pickScope({ indexIds: this.chatIndexIds(), datasets: this.chatDatasets() });
    if (!chosen) return;
    try {
      this.indexes = await api.listIndexes();
      if (this.id) {
        const updated = await api.updateChat(this.id, chosen);
        this.chat = { ...this.chat, ...updated, datasets: updated?.datasets ?? chosen.datasets };
      } else {
        // No chat yet: remember the choice and send it when the chat is created.
        this.pendingScope = chosen;
        this.chat = null;
      }
      this.updateScope();
      announce(t("Documents searched: {textContent}", { textContent: this.scopeButton.textContent }));
    } catch (err) {
      this.showError(err.message);
    }
  }

  scrollToEnd(force = false) {
    const { scrollTop, scrollHeight, clientHeight } = this.scroller;
    // Follow the answer only if the reader has not scrolled up to read something else.
    if (force || scrollHeight - scrollTop - clientHeight < 160) this.scroller.scrollTop = scrollHeight;
  }

  autosize() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 220)}px`;
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = !message;
  }

  setBusy(busy) {
    this.sendButton.hidden = busy;
    this.stopButton.hidden = !busy;
    if (busy) this.stopButton.focus();
    else if (document.activeElement === this.stopButton || document.activeElement === document.body) this.input.focus();
  }

  // ---- a turn ------------------------------------------------------------------------------------

  async submit() {
    const text = this.input.value.trim();
    if (!text || this.controller) return;
    this.showError("");
    if (!this.id) {
      try {
        if (!this.pendingScope && this.indexes === null) this.indexes = await this.indexesLoaded;
        const scope = this.pendingScope || { index_ids: this.chatIndexIds() };
        this.chat = await api.createChat(scope);
        this.id = String(this.chat.id);
        replaceRoute(`#/chats/${encodeURIComponent(this.id)}`);
        this.shell.chatList.setActive(this.id);
        this.messages.replaceChildren();
      } catch (err) {
        if (err.status !== 401) this.showError(err.message);
        return;
      }
    }
    this.input.value = "";
    this.autosize();
    await this.runTurn(text);
  }

  /** Stop asks the gateway to end the turn (model call included); the stream then ends with `interrupted`.
   * Only if that request fails is the stream dropped here. */
  async stop() {
    if (!this.controller || this.stopped) return;
    this.stopped = true;
    this.stopButton.disabled = true;
    try {
      await api.stopTurn(this.id);
    } catch (err) {
      // 409: the turn ended meanwhile; its own events say how. Anything else: stop reading at least.
      if (err.status !== 409) this.controller?.abort();
    } finally {
      this.stopButton.disabled = false;
    }
  }

  /** Follows the chat's running turn (reload, second tab): the snapshot, then the live events. */
  async rejoin() {
    if (this.controller) return;
    const turn = new AssistantMessage({ chatId: this.id });
    let question = null;
    await this.followTurn(turn, (signal) => api.rejoinTurn(this.id, signal), (event, data) => {
      if (event !== "snapshot") return;
      question = renderUserMessage(data.question || "");
      this.messages.append(question, turn.element);
      turn.applySnapshot(data);
      this.scrollToEnd(true);
    });
    if (!question && !this.destroyed) {
      // 204: it ended between the two requests; show it as stored.
      try {
        this.chat = await api.getChat(this.id);
        this.renderChat({ rejoin: false });
      } catch {
        /* the stored chat stays on screen */
      }
    }
  }

  async runTurn(text) {
    this.messages.append(renderUserMessage(text));
    const turn = new AssistantMessage({ chatId: this.id });
    this.messages.append(turn.element);
    this.scrollToEnd(true);
    // The interface's language: the answer's (and its fixed texts') only when the message is too short or unsure
    // to detect ("merci ?"); a question clearly in another language is answered in that one.
    const body = { message: text, options: { language: currentLocale() } };
    if (this.forceRag.checked) body.force_rag = true;
    await this.followTurn(turn, (signal) => api.streamTurn(this.id, body, signal));
  }

  /** Reads one turn's stream into `turn`; `open(signal)` starts the request (null body: nothing runs). */
  async followTurn(turn, open, onEvent = null) {
    this.controller = new AbortController();
    this.stopped = false;
    this.setBusy(true);
    let finished = false;
    let started = false;
    try {
      const response = await open(this.controller.signal);
      if (response.status === 204) return;
      started = true;
      for await (const { event, data } of readEvents(response)) {
        if (this.destroyed) break;
        onEvent?.(event, data);
        finished = this.handleEvent(turn, event, data) || finished;
        this.scrollToEnd();
      }
      if (!finished && !this.destroyed) turn.interrupt(this.stopped);
    } catch (err) {
      if (this.destroyed) return;
      if (!started && onEvent) return; // a rejoin that found nothing to follow
      if (err.name === "AbortError") turn.interrupt(this.stopped);
      else if (err instanceof ApiError) {
        if (err.status === 401) return;
        turn.fail({ error: err.message });
      } else turn.interrupt(false);
    } finally {
      this.controller = null;
      if (!this.destroyed) {
        this.setBusy(false);
        this.scrollToEnd();
        this.afterTurn();
      }
    }
  }

  /** Applies one stream event; true once the turn has ended (done, error or interrupted). */
  handleEvent(turn, event, data) {
    switch (event) {
      case "route":
        turn.addRoute(data);
        return false;
      case "step":
        turn.addStep(data);
        return false;
      case "documents":
        turn.setDocuments(data.documents);
        return false;
      case "token":
        turn.appendToken(data.token ?? "");
        return false;
      case "done":
        turn.finish(data);
        return true;
      case "error":
        turn.fail(data);
        return true;
      case "snapshot":
        // Drawn by rejoin(); a turn rejoined after its answer was complete (naming the chat) has ended.
        return Boolean(data.done);
      case "interrupted":
        // Stopped (here, in another tab, or through the API) or left by a gateway that stopped.
        turn.interrupt(data.code === "stopped", { reason: data.error });
        return true;
      case "title":
        if (data.title) this.setTitle(data.title);
        return false;
      default:
        if (event === "saved" && data?.message_id) {
          turn.messageId = data.message_id; // its sources can be opened and it can be rated now
          attachFeedback(turn, this.id);
          this.exportMenu.hidden = false;
        }
        return false; // any future event needs nothing on screen
    }
  }

  /** Each stored answer's rating buttons, with the user's ratings so far. */
  async loadFeedback() {
    let ratings = {};
    try {
      ratings = (await api.chatFeedback(this.id))?.feedback || {};
    } catch {
      /* the buttons show unrated */
    }
    if (this.destroyed) return;
    for (const [id, turn] of this.turns || []) attachFeedback(turn, this.id, ratings[id] || null);
  }

  /** Saves the chat as a file (Markdown: question, answer and resolved citations; JSON: the typed messages). */
  async exportChat(format) {
    this.exportMenu.open = false;
    try {
      const response = await api.exportChat(this.id, format);
      const blob = await response.blob();
      const disposition = response.headers.get("Content-Disposition") || "";
      const name = /filename="([^"]+)"/.exec(disposition)?.[1] || `chat-${this.id}.${format === "json" ? "json" : "md"}`;
      const url = URL.createObjectURL(blob);
      const link = h("a", { href: url, download: name, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (err) {
      this.showError(err.message);
    }
  }

  /** The first turn gives the chat a title; the list re-sorts by the new activity. */
  async afterTurn() {
    await this.shell.chatList.refresh();
    const listed = this.shell.chatList.get(this.id);
    if (listed) {
      this.chat = { ...this.chat, title: listed.title };
      this.setTitle(listed.title);
    }
  }
}
