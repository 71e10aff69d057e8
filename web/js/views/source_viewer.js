// The source viewer: a cited passage opened in its original, beside the answer.
//
// PDFs render with PDF.js at the cited page (the file is read in byte ranges through the gateway's download
// route), the passage's boxes drawn over the page and the text-layer spans inside them marked; a scanned page
// has no text layer, so its OCR text is laid into the OCR boxes instead. A spreadsheet's cited rows show as a
// small table; any other file as its converted text, scrolled to the passage. Whatever went wrong (the file was
// deleted, the page is past the end, the PDF cannot be read) is said in the pane, never a blank one.

import { api } from "../api.js";
import { h, icon, mount } from "../dom.js";
import { renderMarkdown } from "../markdown.js";
import { t } from "../i18n.js";

const PDFJS = "../../node_modules/pdfjs-dist/build/pdf.min.mjs";
const PDF_WORKER = new URL("../../node_modules/pdfjs-dist/build/pdf.worker.min.mjs", import.meta.url).href;
const STANDARD_FONTS = new URL("../../node_modules/pdfjs-dist/standard_fonts/", import.meta.url).href;
const CMAPS = new URL("../../node_modules/pdfjs-dist/cmaps/", import.meta.url).href;

let pdfjsPromise = null;

function loadPdfjs() {
  pdfjsPromise ||= import(PDFJS).then((pdfjs) => {
    pdfjs.GlobalWorkerOptions.workerSrc = PDF_WORKER;
    return pdfjs;
  });
  return pdfjsPromise;
}

/** What a citation's place reads as: the location's label, else the page. */
export function placeLabel(doc) {
  if (doc?.location?.label) return doc.location.label;
  return typeof doc?.page === "number" ? `p. ${doc.page}` : "";
}

function overlaps(a, b) {
  const x = Math.min(a.right, b.right) - Math.max(a.left, b.left);
  const y = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
  return x > 0 && y > Math.min(a.bottom - a.top, b.bottom - b.top) * 0.5;
}

export class SourceViewer {
  constructor() {
    this.title = h("h2", { class: "source-title", id: "source-title", text: t("Source") });
    this.place = h("p", { class: "source-place muted" });
    this.note = h("p", { class: "source-note", role: "note", hidden: true });
    this.body = h("div", { class: "source-body" });
    this.closeButton = h(
      "button",
      { class: "icon-button source-close", type: "button", "aria-label": t("Close the source"), title: t("Close"), onclick: () => this.close() },
      icon("close"),
    );
    this.element = h(
      "aside",
      { class: "source-viewer", hidden: true, "aria-labelledby": "source-title", tabindex: "-1" },
      h("header", { class: "source-head" }, h("div", { class: "source-heading" }, this.title, this.place), this.closeButton),
      this.note,
      this.body,
    );
    this.element.addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.close();
    });
    this.generation = 0;
    this.pdf = null;
    this.task = null;
  }

  /** Ends the open PDF's loading task: its worker and the range requests still running. */
  release() {
    this.task?.destroy();
    this.task = null;
    this.pdf = null;
  }

  close() {
    this.generation++;
    this.element.hidden = true;
    this.element.dataset.state = "closed";
    this.release();
    this.body.replaceChildren();
    document.dispatchEvent(new CustomEvent("source-closed"));
  }

  /** Opens source `ref` of answer `messageId` in chat `chatId`; `doc` is what the answer says about it. */
  async open({ chatId, messageId, ref, doc }) {
    const generation = ++this.generation;
    this.release();
    this.element.hidden = false;
    this.element.dataset.state = "loading";
    this.element.dataset.ref = ref;
    this.title.textContent = `${ref} · ${doc?.filename || "source"}`;
    this.place.textContent = placeLabel(doc);
    this.note.hidden = true;
    mount(this.body, h("p", { class: "source-loading muted", text: t("Opening the source…") }));
    const current = () => generation === this.generation;
    let source;
    try {
      if (!messageId) throw new Error(t("This answer is still being saved; open its source again in a moment."));
      source = await api.openSource(chatId, messageId, ref);
    } catch (err) {
      if (current()) this.fail(err.message || t("The source could not be opened."));
      return;
    }
    if (!current()) return;
    this.title.textContent = `${ref} · ${source.filename}`;
    this.place.textContent = placeLabel(source) || source.index_name || "";
    if (source.replaced) {
      this.say(t("This file was replaced since the answer was written; the passage may have moved."));
    }
    try {
      if (source.kind === "pdf") await this.showPdf(source, current);
      else if (source.kind === "sheet") this.showSheet(source);
      else await this.showText(source, current);
      if (current() && this.element.dataset.state !== "error") this.element.dataset.state = "ready";
    } catch (err) {
      if (current()) this.fail(err.message || t("The source could not be shown."));
    }
  }

  say(text) {
    this.note.textContent = text;
    this.note.hidden = false;
  }

  fail(message) {
    this.element.dataset.state = "error";
    mount(this.body, h("p", { class: "source-error", role: "alert" }, icon("alert"), h("span", { text: message })));
  }

  // ---- PDF ---------------------------------------------------------------------------------------

  async showPdf(source, current) {
    const pdfjs = await loadPdfjs();
    const task = (this.task = pdfjs.getDocument({
      url: source.file_url,
      withCredentials: true,
      isEvalSupported: false,
      disableAutoFetch: true, // only the ranges the shown page needs
      disableStream: true,
      rangeChunkSize: 32768,
      standardFontDataUrl: STANDARD_FONTS,
      cMapUrl: CMAPS,
      useWasm: false, // the page's CSP allows no WebAssembly; the JavaScript decoders are used
    }));
    let pdf;
    try {
      pdf = await task.promise;
    } catch (err) {
      throw new Error(t("{filename} could not be read as a PDF ({error}).", { filename: source.filename, error: err.message || err.name }));
    }
    if (!current()) {
      task.destroy();
      return;
    }
    this.pdf = pdf;
    const location = source.location || {};
    const cited = (location.pages && location.pages[0]) || source.page || 1;
    if (cited > pdf.numPages) {
      this.fail(
        t("The answer cites page {cited}, but {filename} has {count} pages now.", { cited, filename: source.filename, count: pdf.numPages }),
      );
      return;
    }
    await this.showPdfPage(source, cited, current);
  }

  async showPdfPage(source, number, current) {
    const pdf = this.pdf;
    const page = await pdf.getPage(number);
    if (!current()) return;
    const width = Math.max(280, this.body.clientWidth - 24 || 560);
    const base = page.getViewport({ scale: 1 });
    const viewport = page.getViewport({ scale: width / base.width });
    const ratio = window.devicePixelRatio || 1;
    const canvas = h("canvas", { class: "pdf-canvas" });
    canvas.width = Math.floor(viewport.width * ratio);
    canvas.height = Math.floor(viewport.height * ratio);
    canvas.style.width = `${Math.floor(viewport.width)}px`;
    canvas.style.height = `${Math.floor(viewport.height)}px`;
    const textLayer = h("div", { class: "textLayer" });
    const marks = h("div", { class: "pdf-marks" });
    const sheet = h("div", { class: "pdf-page", dataset: { page: String(number) } }, canvas, marks, textLayer);
    sheet.style.width = `${Math.floor(viewport.width)}px`;
    sheet.style.height = `${Math.floor(viewport.height)}px`;
    sheet.style.setProperty("--scale-factor", String(viewport.scale));
    sheet.style.setProperty("--total-scale-factor", String(viewport.scale));
    const location = source.location || {};
    const pages = location.pages || [number];
    const nav = this.pageNav(source, number, pages);
    mount(this.body, nav, h("div", { class: "pdf-scroll" }, sheet));
    const context = canvas.getContext("2d");
    await page.render({
      canvasContext: context,
      viewport,
      transform: ratio === 1 ? null : [ratio, 0, 0, ratio, 0, 0],
    }).promise;
    if (!current()) return;
    const pdfjs = await loadPdfjs();
    await new pdfjs.TextLayer({ textContentSource: page.streamTextContent(), container: textLayer, viewport }).render();
    if (!current()) return;
    const boxes = (location.boxes || []).filter((b) => b[0] === number);
    const rects = boxes.map(([, x0, y0, x1, y1]) => ({
      left: x0 * viewport.width,
      top: y0 * viewport.height,
      right: x1 * viewport.width,
      bottom: y1 * viewport.height,
    }));
    for (const r of rects) {
      const mark = h("div", { class: "pdf-mark" });
      Object.assign(mark.style, {
        left: `${r.left - 2}px`,
        top: `${r.top - 2}px`,
        width: `${r.right - r.left + 4}px`,
        height: `${r.bottom - r.top + 4}px`,
      });
      marks.append(mark);
    }
    const origin = sheet.getBoundingClientRect();
    let marked = 0;
    for (const span of textLayer.querySelectorAll("span")) {
      const b = span.getBoundingClientRect();
      const rect = { left: b.left - origin.left, top: b.top - origin.top, right: b.right - origin.left, bottom: b.bottom - origin.top };
      if (span.textContent.trim() && rects.some((r) => overlaps(rect, r))) {
        span.classList.add("passage");
        marked++;
      }
    }
    if (!marked && location.ocr && rects.length) {
      // A scanned page has no text layer: the OCR text of the passage is laid into its boxes, selectable.
      const union = rects.reduce((a, r) => ({
        left: Math.min(a.left, r.left),
        top: Math.min(a.top, r.top),
        right: Math.max(a.right, r.right),
        bottom: Math.max(a.bottom, r.bottom),
      }));
      const ocr = h("span", { class: "ocr-text passage", text: source.text });
      Object.assign(ocr.style, {
        left: `${union.left}px`,
        top: `${union.top}px`,
        width: `${union.right - union.left}px`,
        height: `${union.bottom - union.top}px`,
      });
      textLayer.append(ocr);
      marked = 1;
    }
    sheet.dataset.highlighted = String(marked);
    if (!rects.length) {
      this.say(
        source.location
          ? t("The passage's position on this page is not known; it is shown below the page.")
          : t("This index was built before passages kept their position: rebuild it to highlight them. The passage is shown below the page."),
      );
    }
    if (!rects.length || !marked) this.body.append(h("blockquote", { class: "source-passage", text: source.text }));
    const first = marks.firstElementChild;
    if (first) first.scrollIntoView({ block: "center", inline: "nearest" });
  }

  pageNav(source, number, pages) {
    const total = this.pdf.numPages;
    const go = (n) => () => {
      const generation = ++this.generation;
      this.showPdfPage(source, n, () => generation === this.generation).catch((err) => this.fail(err.message));
    };
    const cited = pages.includes(number);
    return h(
      "div",
      { class: "pdf-nav" },
      h("button", { class: "button ghost", type: "button", disabled: number <= 1, onclick: go(number - 1), "aria-label": t("Previous page"), text: "‹" }),
      h("span", { class: "pdf-page-label", text: `${t("Page {number} of {total}", { number, total })}${cited ? ` · ${t("cited")}` : ""}` }),
      h("button", { class: "button ghost", type: "button", disabled: number >= total, onclick: go(number + 1), "aria-label": t("Next page"), text: "›" }),
    );
  }

  // ---- spreadsheet rows and text -------------------------------------------------------------------

  showSheet(source) {
    const location = source.location || {};
    const table = renderMarkdown(source.text);
    const caption = location.label || placeLabel(source);
    mount(
      this.body,
      h("p", { class: "sheet-caption", text: caption }),
      h("div", { class: "source-table passage", dataset: { rows: (location.rows || []).join("-") } }, table),
    );
  }

  async showText(source, current) {
    const data = await api.documentText(source.text_url);
    if (!current()) return;
    const chunks = Array.isArray(data.chunks) ? data.chunks : [];
    let target = chunks.find((c) => c.chunk_index === source.chunk_index && c.text === source.text);
    if (!target) target = chunks.find((c) => c.text === source.text);
    const items = chunks.map((c) => {
      const part = h("section", { class: `source-chunk${c === target ? " passage" : ""}`, dataset: { chunk: String(c.chunk_index) } });
      part.append(renderMarkdown(c.text));
      return part;
    });
    mount(this.body, h("div", { class: "source-text markdown" }, ...items));
    if (!target) {
      this.say(t("The passage is no longer in this file (it changed since the answer); the answer quoted:"));
      this.body.prepend(h("blockquote", { class: "source-passage", text: source.text }));
      return;
    }
    const el = this.body.querySelector(".source-chunk.passage");
    el?.scrollIntoView({ block: "center" });
  }
}
