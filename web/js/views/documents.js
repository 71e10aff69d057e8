// Indexes and their documents: create an index, upload files into a dataset (drag and drop, several at
// once, per-file progress, the gateway's reason when a file is refused), list, download, delete.
// The list has the user's own indexes and those shared with them (with the owner's name); what the page offers
// follows the user's access: a reader sees no upload, delete or rebuild, only the owner (or an admin) shares.

import { api } from "../api.js";
import { confirmDialog } from "../dialogs.js";
import { announce, formatBytes, h, icon, mount, relativeTime } from "../dom.js";
import { navigate } from "../router.js";
import { readEvents } from "../sse.js";
import { shareDialog } from "./share.js";
import { UploadQueue } from "./upload_queue.js";
import { currentLocale, languageName, t } from "../i18n.js";
import { DEFAULT_EMBEDDER, DEFAULT_INDEX_LANGUAGE, EMBEDDERS, INDEX_LANGUAGES } from "../languages.js";


export class DocumentsView {
  constructor(shell, indexId) {
    this.shell = shell;
    this.indexId = indexId;
    this.indexes = [];
    this.index = null;
    // Uploads outlive a re-render of the index (and a switch to another one): the queue belongs to the view.
    this.uploads = new UploadQueue((item) => {
      if (!this.destroyed && item.indexId === this.indexId) return this.refreshDocuments();
    });
    this.destroyed = false;
    this.indexList = h("ul", { class: "index-list", role: "list" });
    this.detail = h("div", { class: "index-detail" });
    this.element = h(
      "section",
      { class: "page documents-view", "aria-labelledby": "documents-title" },
      shell.header(h("h1", { class: "topbar-title", id: "documents-title", text: t("Documents") })),
      h(
        "div",
        { class: "page-body two-pane" },
        h(
          "div",
          { class: "pane-side" },
          h("h2", { class: "pane-title", text: t("Indexes") }),
          this.indexList,
          this.renderCreateForm(),
        ),
        this.detail,
      ),
    );
  }

  async start() {
    document.title = t("Documents · RAG Chat");
    await this.loadIndexes();
  }

  destroy() {
    this.destroyed = true;
    // Leaving mid-build: the gateway goes on with it; coming back rejoins it.
    this.buildController?.abort();
  }

  async loadIndexes() {
    try {
      this.indexes = await api.listIndexes();
    } catch (err) {
      if (err.status !== 401) mount(this.detail, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    if (this.destroyed) return;
    if (!this.indexId && this.indexes.length) this.indexId = String(this.indexes[0].id);
    this.renderIndexList();
    if (this.indexId) await this.loadIndex();
    else this.renderNoIndex();
  }

  renderIndexList() {
    // Mine (owned), shared with me (a grant, a group, everyone) and, for an administrator, everyone else's.
    const mine = this.indexes.filter((index) => !index.via || index.via === "owner");
    const shared = this.indexes.filter((index) => index.via && !["owner", "admin"].includes(index.via));
    const others = this.indexes.filter((index) => index.via === "admin");
    const link = (index, withOwner) =>
      h(
        "li",
        {},
        h(
          "a",
          {
            class: "index-link",
            href: `#/documents/${encodeURIComponent(index.id)}`,
            "aria-current": String(index.id) === String(this.indexId) ? "page" : false,
            dataset: { access: index.access || "owner" },
          },
          icon("database"),
          h("span", { class: "index-name", text: index.name }),
          withOwner ? h("span", { class: "index-owner muted small", text: index.owner }) : null,
          index.embedder ? h("span", { class: "index-settings muted small", text: settingsLine(index) }) : null,
        ),
      );
    const section = (title, indexes, withOwner) =>
      indexes.length
        ? [h("li", { class: "index-section", role: "presentation" }, h("h3", { class: "pane-subtitle", text: title })), ...indexes.map((i) => link(i, withOwner))]
        : [];
    mount(
      this.indexList,
      this.indexes.length
        ? [...mine.map((index) => link(index, false)), ...section(t("Shared with me"), shared, true), ...section(t("Other users' (admin)"), others, true)]
        : h("li", { class: "muted", text: t("No indexes yet") }),
    );
    if (this.indexes.length && !mine.length) this.indexList.prepend(h("li", { class: "muted", text: t("No indexes of your own yet") }));
  }

  /** What the signed-in user may do with the open index (the gateway checks it again on every request). */
  can(what) {
    const access = this.index?.access || "owner";
    if (what === "read") return true;
    if (what === "edit") return access === "owner" || access === "editor";
    return access === "owner"; // share, transfer, delete the index
  }

  renderCreateForm() {
    const name = h("input", {
      class: "input",
      id: "new-index-name",
      name: "name",
      required: true,
      pattern: "[A-Za-z0-9_\\-]{1,64}",
      placeholder: t("e.g. handbook"),
      autocomplete: "off",
      title: t("Letters, digits, _ and -, up to 64"),
    });
    const description = h("input", { class: "input", id: "new-index-description", name: "description", placeholder: t("Optional"), autocomplete: "off" });
    // Fixed for good when the index is made: its passages' embedding model and its full-text language.
    const embedder = h(
      "select",
      { class: "input", id: "new-index-embedder", name: "embedder" },
      EMBEDDERS.map((name) => h("option", { value: name, selected: name === DEFAULT_EMBEDDER, text: embedderName(name) })),
    );
    const language = h(
      "select",
      { class: "input", id: "new-index-language", name: "language" },
      INDEX_LANGUAGES.map((code) => [code, languageName(code)])
        .sort((a, b) => a[1].localeCompare(b[1], currentLocale()))
        .map(([code, label]) => h("option", { value: code, lang: code, selected: code === DEFAULT_INDEX_LANGUAGE, text: label })),
    );
    const error = h("p", { class: "form-error", role: "alert", hidden: true });
    return h(
      "form",
      {
        class: "card create-index",
        "aria-labelledby": "create-index-title",
        onsubmit: async (event) => {
          event.preventDefault();
          error.hidden = true;
          try {
            // The defaults are left unsaid: the worker makes the table with them at the first upload.
            const index = await api.createIndex(name.value.trim(), description.value.trim() || undefined, {
              embedder: embedder.value === DEFAULT_EMBEDDER ? undefined : embedder.value,
              language: language.value === DEFAULT_INDEX_LANGUAGE ? undefined : language.value,
            });
            name.value = "";
            description.value = "";
            embedder.value = DEFAULT_EMBEDDER;
            language.value = DEFAULT_INDEX_LANGUAGE;
            announce(t("Index {name} created", { name: index.name }));
            navigate(`#/documents/${encodeURIComponent(index.id)}`);
          } catch (err) {
            error.textContent = err.message;
            error.hidden = false;
          }
        },
      },
      h("h3", { id: "create-index-title", text: t("New index") }),
      h("label", { class: "field", for: "new-index-name" }, h("span", { text: t("Name") }), name),
      h("label", { class: "field", for: "new-index-description" }, h("span", { text: t("Description") }), description),
      h("label", { class: "field", for: "new-index-language" }, h("span", { text: t("Language of its documents") }), language),
      h("label", { class: "field", for: "new-index-embedder" }, h("span", { text: t("Embedding model") }), embedder),
      h("p", { class: "muted small", text: t("Both are fixed when the index is made. The multilingual model finds passages across languages, and is slower.") }),
      error,
      h("button", { class: "button primary block", type: "submit" }, icon("plus"), h("span", { text: t("Create index") })),
    );
  }

  renderNoIndex() {
    mount(
      this.detail,
      h(
        "div",
        { class: "empty-state" },
        icon("database"),
        h("h2", { text: t("Create your first index") }),
        h("p", { class: "muted", text: t("An index holds documents, grouped into datasets. Chats search the indexes you pick.") }),
      ),
    );
  }

  async loadIndex() {
    try {
      this.index = await api.getIndex(this.indexId);
    } catch (err) {
      if (err.status === 404) mount(this.detail, h("p", { class: "muted", text: t("This index does not exist.") }));
      else if (err.status !== 401) mount(this.detail, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    if (this.destroyed) return;
    this.renderIndex();
  }

  documents() {
    // GET /api/indexes/{id}: `documents` is the list, `document_count` the count.
    return this.index?.documents ?? [];
  }

  stats() {
    const docs = this.documents();
    const chunks = typeof this.index?.chunks === "number" ? this.index.chunks : docs.reduce((sum, doc) => sum + (doc.chunks || 0), 0);
    const n = this.datasets().length;
    return [t("{count} documents", { count: docs.length }), t("{count} chunks", { count: chunks }), t("{count} datasets", { count: n })].join(" · ");
  }

  datasets() {
    const names = new Set((this.index?.datasets || []).map((d) => (typeof d === "string" ? d : d.name)));
    for (const doc of this.documents()) if (doc.dataset) names.add(doc.dataset);
    return [...names].sort();
  }

  renderIndex() {
    const index = this.index;
    this.uploadList = h("ul", { class: "upload-list", role: "list", "aria-label": t("Uploads") });
    this.table = h("div", { class: "doc-table-wrap" });
    mount(
      this.detail,
      h(
        "div",
        { class: "index-head" },
        h(
          "div",
          {},
          h("h2", { class: "index-title", text: index.name }),
          index.description ? h("p", { class: "muted", text: index.description }) : null,
          h("p", { class: "muted small index-stats", text: this.stats() }),
          index.via && index.via !== "owner"
            ? h("p", { class: "muted small index-access", text: accessLine(index) })
            : null,
        ),
        this.can("share")
          ? h(
              "button",
              {
                class: "button ghost",
                type: "button",
                onclick: async () => {
                  // Given away: the page shows it as the caller now has it (an editor, by default).
                  if ((await shareDialog(index)) === "transferred") await this.loadIndexes();
                },
              },
              icon("share"),
              h("span", { text: t("Share") }),
            )
          : null,
        this.can("share")
          ? h(
              "a",
              { class: "button ghost index-ratings", href: `#/ratings/${encodeURIComponent(index.id)}` },
              h("span", { text: t("Ratings") }),
            )
          : null,
        (this.rebuildButton = h(
          "button",
          { class: "button ghost", type: "button", hidden: !this.can("edit"), onclick: () => this.followBuild(true) },
          icon("upload"),
          h("span", { text: t("Rebuild") }),
        )),
        this.can("delete")
          ? h(
              "button",
              { class: "button ghost danger-text", type: "button", onclick: () => this.deleteIndex() },
              icon("trash"),
              h("span", { text: t("Delete index") }),
            )
          : null,
      ),
      this.can("edit") ? this.renderUploader() : null,
      (this.buildBox = this.renderBuildBox()),
      this.uploadList,
      this.table,
    );
    this.uploads.showIn(this.uploadList);
    this.uploads.resume(this.indexId); // uploads being indexed, sent from here before or from elsewhere
    this.renderTable();
    // A build queued or running (here or elsewhere) is rejoined from its job; 204 when there is none.
    this.followBuild(false);
  }

  // ---- a (re)build: per-file progress, which outlives this page and is rejoined when it comes back ----

  renderBuildBox() {
    this.buildBar = h("progress", { max: 100, value: 0, "aria-label": t("Rebuild progress") });
    this.buildText = h("span", { class: "build-status", text: "" });
    return h("div", { class: "card build-progress", hidden: true, role: "status" }, this.buildText, this.buildBar);
  }

  showBuild({ done = 0, total = 0, file = "", stage = "", ocr = null }) {
    this.buildBox.hidden = false;
    this.buildBar.value = total ? Math.round((done / total) * 100) : 0;
    const count = total ? t("{done} / {total} files", { done, total }) : t("starting");
    const shown = ocr ? stageLabel({ stage, ocr }) : stage;
    this.buildText.textContent = `${t("Rebuilding")} · ${count}${file ? ` · ${file}: ${shown}` : ""}`;
  }

  /** `start`: ask for a rebuild; otherwise rejoin the one the gateway is running (204: none). */
  async followBuild(start) {
    if (this.buildController) return;
    const controller = (this.buildController = new AbortController());
    this.rebuildButton.disabled = true;
    let ended = null;
    try {
      const response = start ? await api.startBuild(this.indexId, true, controller.signal) : await api.rejoinBuild(this.indexId, controller.signal);
      if (response.status === 204) return;
      this.showBuild({});
      for await (const { event, data } of readEvents(response)) {
        if (event === "snapshot") {
          const last = data.files?.[data.files.length - 1] || {};
          this.showBuild({ done: data.done, total: data.total, file: last.file, stage: last.stage });
        } else if (event === "progress") this.showBuild(data);
        else if (event === "done" || event === "error") {
          ended = { event, data };
          break;
        }
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      ended = { event: "error", data: { error: err.message } };
    } finally {
      if (this.buildController === controller) this.buildController = null;
      if (!this.destroyed && this.rebuildButton) this.rebuildButton.disabled = false;
    }
    if (this.destroyed) return;
    if (ended?.event === "done") {
      this.buildBar.value = 100;
      const chunks = ended.data?.chunks;
      this.buildText.textContent = typeof chunks === "number" ? `${t("Rebuilt")} · ${t("{count} chunks", { count: chunks })}` : t("Rebuilt");
      announce(t("Rebuild finished"));
    } else if (ended) {
      this.buildText.textContent = t("Rebuild failed: {error}", { error: ended.data?.error || t("unknown error") });
      announce(this.buildText.textContent);
    } else {
      this.buildText.textContent = t("The rebuild's progress was lost; reload to see its result.");
    }
    await this.refreshDocuments();
  }

  renderUploader() {
    const datalist = h("datalist", { id: "dataset-options" }, this.datasets().map((name) => h("option", { value: name })));
    this.datasetInput = h("input", {
      class: "input",
      id: "upload-dataset",
      name: "dataset",
      value: this.datasetInput?.value || this.datasets()[0] || "default",
      list: "dataset-options",
      required: true,
      pattern: "[A-Za-z0-9_\\-]{1,64}",
      title: t("Letters, digits, _ and -, up to 64"),
      autocomplete: "off",
    });
    const fileInput = h("input", {
      type: "file",
      multiple: true,
      class: "visually-hidden",
      id: "upload-files",
      onchange: () => {
        this.enqueue([...fileInput.files]);
        fileInput.value = "";
      },
    });
    const zone = h(
      "div",
      { class: "dropzone", "aria-describedby": "dropzone-hint" },
      icon("upload"),
      h("p", {}, h("strong", { text: t("Drop files here") }), " or ", h("label", { class: "link-button", for: "upload-files", tabindex: "0", role: "button", text: t("choose files"), onkeydown: (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          fileInput.click();
        }
      } })),
      h("p", { class: "muted small", id: "dropzone-hint", text: t("PDF, Word, HTML, Markdown, text, CSV… several at once.") }),
      fileInput,
    );
    const over = (on) => (event) => {
      event.preventDefault();
      zone.classList.toggle("dragover", on);
    };
    zone.addEventListener("dragenter", over(true));
    zone.addEventListener("dragover", over(true));
    zone.addEventListener("dragleave", over(false));
    zone.addEventListener("drop", (event) => {
      over(false)(event);
      this.enqueue([...(event.dataTransfer?.files || [])]);
    });
    return h(
      "div",
      { class: "card uploader" },
      h("label", { class: "field inline", for: "upload-dataset" }, h("span", { text: t("Upload into dataset") }), this.datasetInput, datalist),
      zone,
    );
  }

  enqueue(files) {
    if (!files.length) return;
    if (!this.datasetInput.reportValidity()) return;
    this.uploads.add(files, this.datasetInput.value.trim(), this.indexId);
  }

  async refreshDocuments() {
    try {
      this.index = await api.getIndex(this.indexId);
    } catch {
      return;
    }
    if (this.destroyed) return;
    this.renderTable();
    const stats = this.detail.querySelector(".index-stats");
    if (stats) stats.textContent = this.stats();
    if (!this.can("edit")) return;
    const datalist = this.detail.querySelector("#dataset-options");
    datalist?.replaceChildren(...this.datasets().map((name) => h("option", { value: name })));
  }

  renderTable() {
    const docs = [...this.documents()].sort(
      (a, b) => String(a.dataset).localeCompare(String(b.dataset)) || String(a.filename).localeCompare(String(b.filename)),
    );
    if (!docs.length) {
      mount(this.table, h("p", { class: "muted empty-table", text: t("No documents in this index yet.") }));
      return;
    }
    mount(
      this.table,
      h(
        "table",
        { class: "doc-table" },
        h("caption", { class: "visually-hidden", text: t("Documents in {name}", { name: this.index.name }) }),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            h("th", { scope: "col", text: t("File") }),
            h("th", { scope: "col", text: t("Dataset") }),
            h("th", { scope: "col", class: "num", text: t("Chunks") }),
            h("th", { scope: "col", class: "num hide-narrow", text: t("Size") }),
            h("th", { scope: "col", class: "hide-narrow", text: t("Indexed") }),
            h("th", { scope: "col", class: "visually-hidden-th" }, h("span", { class: "visually-hidden", text: t("Actions") })),
          ),
        ),
        h("tbody", {}, docs.map((doc) => this.renderRow(doc))),
      ),
    );
  }

  renderRow(doc) {
    return h(
      "tr",
      { dataset: { filename: doc.filename, dataset: doc.dataset || "" } },
      h("td", { class: "file-cell" }, h("span", { class: "file-name", text: doc.filename })),
      h("td", {}, h("span", { class: "tag", text: doc.dataset || "" })),
      h("td", { class: "num", text: doc.chunks ?? "" }),
      h("td", { class: "num hide-narrow", text: formatBytes(doc.bytes) }),
      h("td", { class: "hide-narrow muted", text: relativeTime(doc.indexed_at || doc.created_at) }),
      h(
        "td",
        { class: "row-actions" },
        h(
          "button",
          { class: "icon-button small", type: "button", "aria-label": t("Download {filename}", { filename: doc.filename }), title: t("Download"), onclick: () => this.download(doc) },
          icon("download"),
        ),
        this.can("edit")
          ? h(
              "button",
              { class: "icon-button small", type: "button", "aria-label": t("Delete {filename}", { filename: doc.filename }), title: t("Delete"), onclick: () => this.deleteDocument(doc) },
              icon("trash"),
            )
          : null,
      ),
    );
  }

  async download(doc) {
    try {
      // The download needs the bearer token, so it goes through fetch and a temporary object URL.
      const response = await api.downloadDocument(this.indexId, documentId(doc));
      const url = URL.createObjectURL(await response.blob());
      const link = h("a", { href: url, download: doc.filename, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      if (err.status !== 401) announce(t("Download failed: {message}", { message: err.message }));
    }
  }

  async deleteDocument(doc) {
    const ok = await confirmDialog({
      title: t("Delete {filename}?", { filename: doc.filename }),
      message: t("The file and its passages are removed from this index. Chats will no longer find it."),
      confirm: t("Delete"),
      danger: true,
    });
    if (!ok) return;
    try {
      await api.deleteDocument(this.indexId, documentId(doc));
      announce(t("{filename} deleted", { filename: doc.filename }));
    } catch (err) {
      announce(t("Could not delete: {message}", { message: err.message }));
    }
    await this.refreshDocuments();
  }

  async deleteIndex() {
    const ok = await confirmDialog({
      title: t("Delete the index “{name}”?", { name: this.index.name }),
      message: t("All its documents and passages are deleted. Chats that search it will no longer find them."),
      confirm: t("Delete index"),
      danger: true,
    });
    if (!ok) return;
    try {
      await api.deleteIndex(this.indexId);
      announce(t("Index {name} deleted", { name: this.index.name }));
      navigate("#/documents");
    } catch (err) {
      announce(t("Could not delete: {message}", { message: err.message }));
    }
  }
}

function accessLine(index) {
  const role = index.access === "editor" ? t("You can edit") : index.access === "reader" ? t("You can ask") : t("You manage");
  const via =
    index.via === "group"
      ? ` (${t("group {name}", { name: index.via_group })})`
      : index.via === "everyone"
        ? ` (${t("shared with everyone")})`
        : index.via === "admin"
          ? ` (${t("administrator")})`
          : "";
  return t("Owner: {owner} · {role}{via}", { owner: index.owner, role, via });
}

function documentId(doc) {
  return doc.id ?? doc.document_id;
}

/** "MiniLM" or "multilingual E5": an index's embedding model, as the index list names it. */
function embedderName(name) {
  return name === "multilingual-e5-small" ? t("Multilingual E5 (multilingual-e5-small)") : t("MiniLM (English)");
}

/** "Korean · MiniLM (English)": what an index searches with, under its name in the list. */
function settingsLine(index) {
  return [index.language ? languageName(index.language) : null, embedderName(index.embedder)].filter(Boolean).join(" · ");
}
