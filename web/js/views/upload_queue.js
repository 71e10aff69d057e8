// The upload queue of the documents page: files waiting, two indexed at a time, each with its progress bar and
// the gateway's reason when it is refused. It outlives a re-render of the index it uploads into.
// Once sent, a file is the gateway's job (it goes on when this page goes): coming back to the index, or opening
// it on another device, shows the uploads still being indexed from the index's jobs, followed to their end.

import { api, uploadDocument } from "../api.js";
import { announce, formatBytes, h, icon } from "../dom.js";
import { formatNumber, t } from "../i18n.js";
import { readEvents } from "../sse.js";

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
    this.followed = new Set(); // the jobs resumed here (by id), so a re-render does not show one twice
  }

  // The list the rows show in: after a re-render, the rows still going move to the new one.
  showIn(list) {
    this.list = list;
    for (const item of this.items) if (!item.done) list.append(item.row);
  }

  row(name, size, dataset) {
    const bar = h("progress", { max: 100, value: 0, "aria-label": t("Upload of {name}", { name }) });
    const status = h("span", { class: "upload-status", text: t("Waiting…") });
    const row = h(
      "li",
      { class: "upload-item", dataset: { file: name } },
      h("span", { class: "upload-name", text: name }),
      h("span", { class: "muted small", text: `${formatBytes(size)} → ${dataset}` }),
      bar,
      status,
    );
    return { bar, status, row };
  }

  add(files, dataset, indexId) {
    for (const file of files) {
      this.items.push({ file, dataset, indexId, ...this.row(file.name, file.size, dataset), done: false });
      this.list?.append(this.items[this.items.length - 1].row);
    }
    announce(t("{count} files queued for upload", { count: files.length }));
    this.pump();
  }

  /** The index's uploads still being indexed (sent from here before, another tab or device): followed here. */
  async resume(indexId) {
    let jobs = [];
    try {
      jobs = (await api.listJobs(indexId)).filter((j) => j.kind === "upload" && (j.state === "queued" || j.state === "running"));
    } catch {
      return; // the documents list still shows; the jobs are followed next time
    }
    for (const job of jobs.reverse()) {
      if (this.followed.has(job.id) || this.items.some((i) => i.jobId === job.id)) continue;
      this.followed.add(job.id);
      let view = job;
      try {
        view = await api.getJob(job.id);
      } catch {
        continue;
      }
      const file = view.files?.[0];
      if (!file) continue;
      const item = { file: { name: file.filename }, dataset: file.dataset, indexId, ...this.row(file.filename, file.bytes, file.dataset) };
      Object.assign(item, { jobId: job.id, started: true, done: false });
      item.bar.value = 50;
      item.status.textContent = file.stage ? stageLabel({ stage: file.stage, ...file.progress }) : t("Waiting to be indexed…");
      this.items.push(item);
      this.list?.append(item.row);
      this.follow(item);
    }
  }

  /** Follows an upload's job to its end (the events of any replica), as `upload` shows a file sent from here. */
  async follow(item) {
    let end = null;
    for (let tries = 0; !end && tries < 5; tries += 1) {
      try {
        const response = await api.followJob(item.jobId);
        for await (const { event, data } of readEvents(response)) {
          if (event === "progress") this.showStage(item, { stage: data.stage, ...data.progress });
          else if (event === "job" && ["done", "failed", "cancelled"].includes(data.state)) end = data;
          else if (event === "gone") end = { state: "failed", error: data.error };
        }
      } catch (err) {
        if (err.status === 404) end = { state: "failed", error: err.message };
      }
      if (!end) await new Promise((resolve) => setTimeout(resolve, 1000 * (tries + 1)));
    }
    const file = end?.files?.[0];
    if (end?.state === "done") this.indexed(item, file?.chunks);
    else this.refused(item, new Error(file?.error || end?.error || t("The upload's progress was lost; reload to see it.")));
    item.done = true;
    await this.onDone(item);
  }

  showStage(item, progress) {
    const at = UPLOAD_STAGES.indexOf(progress.stage);
    if (at >= 0) item.bar.value = 50 + Math.round(((at + 1) / (UPLOAD_STAGES.length + 1)) * 50);
    item.status.textContent = stageLabel(progress);
  }

  indexed(item, chunks) {
    item.bar.value = 100;
    item.status.textContent = typeof chunks === "number" ? `${t("Indexed")} · ${t("{count} chunks", { count: chunks })}` : t("Indexed");
    item.row.classList.add("ok");
    announce(t("{name} uploaded", { name: item.file.name }));
  }

  refused(item, err) {
    item.row.classList.add("failed");
    item.bar.hidden = true;
    item.status.replaceChildren(icon("alert"), h("span", { text: err.message }));
    item.status.setAttribute("role", "alert");
    announce(t("{name} was refused: {message}", { name: item.file.name, message: err.message }));
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
          item.status.textContent =
            fraction < 1 ? t("Uploading {percent}", { percent: formatNumber(fraction, { style: "percent" }) }) : t("Indexing…");
        },
        (progress) => this.showStage(item, progress),
        (job) => {
          item.jobId = job.id;
        },
      );
      const chunks = answer?.chunks ?? answer?.document?.chunks;
      this.indexed(item, chunks);
    } catch (err) {
      this.refused(item, err);
    }
    item.done = true;
    await this.onDone(item);
  }
}
