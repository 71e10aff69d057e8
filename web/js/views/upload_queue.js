// The upload queue of the documents page: files waiting, two indexed at a time, each with its progress bar and
// the gateway's reason when it is refused. It outlives a re-render of the index it uploads into.

import { uploadDocument } from "../api.js";
import { announce, formatBytes, h, icon } from "../dom.js";
import { formatNumber, t } from "../i18n.js";

// The worker's indexing stages for one file, in order (docs/design/WORKER_API.md `progress`), as shown to the user.
const UPLOAD_STAGES = ["converting", "chunking", "embedding", "writing"];
const STAGE_LABELS = {
  converting: t("Converting…"),
  chunking: t("Splitting into passages…"),
  embedding: t("Embedding…"),
  writing: t("Writing to the index…"),
};
// OCR reports each scanned page it has read (stage "ocr", with ocr: {page, done, total}).
const stageLabel = (p) =>
  p.stage === "ocr" && p.ocr
    ? t("Reading scanned page {done} of {total}…", { done: p.ocr.done, total: p.ocr.total })
    : STAGE_LABELS[p.stage] || `${p.stage}…`;
const PARALLEL_UPLOADS = 2; // indexing is CPU-heavy on the worker; two at a time keeps the queue moving

export class UploadQueue {
  // onDone(item) runs after each file, indexed or refused.
  constructor(onDone) {
    this.onDone = onDone;
    this.items = [];
    this.active = 0;
    this.list = null;
  }

  // The list the rows show in: after a re-render, the rows still going move to the new one.
  showIn(list) {
    this.list = list;
    for (const item of this.items) if (!item.done) list.append(item.row);
  }

  add(files, dataset, indexId) {
    for (const file of files) {
      const bar = h("progress", { max: 100, value: 0, "aria-label": t("Upload of {name}", { name: file.name }) });
      const status = h("span", { class: "upload-status", text: t("Waiting…") });
      const row = h(
        "li",
        { class: "upload-item", dataset: { file: file.name } },
        h("span", { class: "upload-name", text: file.name }),
        h("span", { class: "muted small", text: `${formatBytes(file.size)} → ${dataset}` }),
        bar,
        status,
      );
      this.items.push({ file, dataset, indexId, bar, status, row, done: false });
      this.list?.append(row);
    }
    announce(t("{count} files queued for upload", { count: files.length }));
    this.pump();
  }

  pump() {
    while (this.active < PARALLEL_UPLOADS) {
      const item = this.items.find((i) => !i.started);
      if (!item) return;
      item.started = true;
      this.active += 1;
      this.upload(item).finally(() => {
        this.active -= 1;
        this.pump();
      });
    }
  }

  async upload(item) {
    item.status.textContent = t("Uploading…");
    try {
      // The bar: the bytes sent fill the first half, the indexing stages the second.
      const answer = await uploadDocument(
        item.indexId,
        item.file,
        item.dataset,
        (fraction) => {
          item.bar.value = Math.round(fraction * 50);
          item.status.textContent = fraction < 1 ? t("Uploading {percent}", { percent: formatNumber(fraction, { style: "percent" }) }) : t("Indexing…");
        },
        (progress) => {
          const at = UPLOAD_STAGES.indexOf(progress.stage);
          if (at >= 0) item.bar.value = 50 + Math.round(((at + 1) / (UPLOAD_STAGES.length + 1)) * 50);
          item.status.textContent = stageLabel(progress);
        },
      );
      item.bar.value = 100;
      const chunks = answer?.chunks ?? answer?.document?.chunks;
      item.status.textContent = typeof chunks === "number" ? `${t("Indexed")} · ${t("{count} chunks", { count: chunks })}` : t("Indexed");
      item.row.classList.add("ok");
      announce(t("{name} uploaded", { name: item.file.name }));
    } catch (err) {
      item.row.classList.add("failed");
      item.bar.hidden = true;
      item.status.replaceChildren(icon("alert"), h("span", { text: err.message }));
      item.status.setAttribute("role", "alert");
      announce(t("{name} was refused: {message}", { name: item.file.name, message: err.message }));
    }
    item.done = true;
    await this.onDone(item);
  }
}
