// The upload queue of the documents page: files waiting, two indexed at a time, each with its progress bar and
// the gateway's reason when it is refused. It outlives a re-render of the index it uploads into.
// Once sent, a file is the gateway's job (it goes on when this page goes): coming back to the index, or opening
// it on another device, shows the uploads still being indexed from the index's jobs, followed to their end, and
// those that ended in the last few minutes with their outcome. A file waiting here, or a job still queued or
// being indexed, can be cancelled (POST /api/jobs/{id}/cancel): the row says "Cancelled", nothing is indexed.

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
const RECENT_MS = 10 * 60 * 1000; // uploads that ended this recently show again, with their outcome
const ENDED = ["done", "failed", "cancelled"];
const endedLately = (job) => ENDED.includes(job.state) && Date.now() - Date.parse(job.finished_at || 0) < RECENT_MS;

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
    const cancelButton = h("button", {
      class: "button ghost small upload-cancel",
      type: "button",
      text: t("Cancel"),
      "aria-label": t("Cancel the upload of {name}", { name }),
    });
    const row = h(
      "li",
      { class: "upload-item", dataset: { file: name } },
      h("span", { class: "upload-name", text: name }),
      h("span", { class: "muted small", text: `${formatBytes(size)} → ${dataset}` }),
      cancelButton,
      bar,
      status,
    );
    return { bar, status, row, cancelButton };
  }

  /** A row's item, with its Cancel button wired. */
  item(fields) {
    const item = { ...fields, ...this.row(fields.file.name, fields.size, fields.dataset), done: false };
    item.cancelButton.addEventListener("click", () => this.cancel(item));
    return item;
  }

  add(files, dataset, indexId) {
    for (const file of files) {
      this.items.push(this.item({ file, size: file.size, dataset, indexId }));
      this.list?.append(this.items[this.items.length - 1].row);
    }
    announce(t("{count} files queued for upload", { count: files.length }));
    this.pump();
  }

  /** Cancel: a file still waiting here is never sent; a sent one's job is cancelled (at once when queued). */
  async cancel(item) {
    if (item.done || item.cancelling) return;
    item.cancelling = true;
    item.cancelButton.disabled = true;
    if (!item.started) {
      item.started = true;
      item.done = true;
      item.endedAt = Date.now();
      this.cancelled(item);
      return;
    }
    item.status.textContent = t("Cancelling…");
    if (item.jobId) await this.cancelJob(item); // else: as soon as the gateway names its job (upload)
  }

  async cancelJob(item) {
    try {
      await api.cancelJob(item.jobId); // the upload's stream (or follow) then ends with the job
    } catch (err) {
      if (item.done) return;
      item.cancelling = false;
      item.cancelButton.disabled = false;
      item.status.textContent = t("The upload could not be cancelled: {message}", { message: err.message });
    }
  }

  /** How a job the user asked to cancel ended: true when it was cancelled (it may have finished first). */
  async wasCancelled(item, err) {
    if (err?.code === "cancelled") return true;
    if (!item.cancelling || !item.jobId) return false;
    try {
      return (await api.getJob(item.jobId)).state === "cancelled";
    } catch {
      return false;
    }
  }

  cancelled(item, quiet = false) {
    item.cancelButton.hidden = true;
    item.bar.hidden = true;
    item.row.classList.add("cancelled");
    item.status.textContent = t("Cancelled");
    if (!quiet) announce(t("The upload of {name} was cancelled", { name: item.file.name }));
  }

  /** The index's uploads still being indexed (sent from here before, another tab or device): followed here. */
  /** The index's uploads still being indexed (sent from here before, another tab or device): followed here; and
   * those that ended in the last few minutes (while this page was away): shown with their outcome. */
  async resume(indexId) {
    // Rows of this index that ended here lately (the page showed another index meanwhile) show again.
    for (const item of this.items) {
      if (item.done && item.indexId === indexId && Date.now() - item.endedAt < RECENT_MS) this.list?.append(item.row);
    }
    let jobs = [];
    try {
      jobs = (await api.listJobs(indexId)).filter((j) => j.kind === "upload" && (j.state === "queued" || j.state === "running" || endedLately(j)));
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
      const item = this.item({ file: { name: file.filename }, size: file.bytes, dataset: file.dataset, indexId });
      Object.assign(item, { jobId: job.id, started: true });
      this.items.push(item);
      this.list?.append(item.row);
      if (ENDED.includes(view.state)) {
        this.ended(item, view, true);
        continue;
      }
      item.bar.value = 50;
      item.status.textContent = file.stage ? stageLabel({ stage: file.stage, ...file.progress }) : t("Waiting to be indexed…");
      this.follow(item);
    }
  }

  /** A row shows how its job ended; `quiet`: one that ended while the page was away (not announced again). */
  ended(item, job, quiet = false) {
    const file = job?.files?.[0];
    item.done = true;
    item.endedAt = Date.now();
    if (job?.state === "done") this.indexed(item, file?.chunks, quiet);
    else if (job?.state === "cancelled") this.cancelled(item, quiet);
    else this.refused(item, new Error(file?.error || job?.error || t("The upload's progress was lost; reload to see it.")), quiet);
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
    this.ended(item, end);
    await this.onDone(item);
  }

  showStage(item, progress) {
    const at = UPLOAD_STAGES.indexOf(progress.stage);
    if (at >= 0) item.bar.value = 50 + Math.round(((at + 1) / (UPLOAD_STAGES.length + 1)) * 50);
    item.status.textContent = stageLabel(progress);
  }

  indexed(item, chunks, quiet = false) {
    item.cancelButton.hidden = true;
    item.bar.value = 100;
    item.status.textContent = typeof chunks === "number" ? `${t("Indexed")} · ${t("{count} chunks", { count: chunks })}` : t("Indexed");
    item.row.classList.add("ok");
    if (!quiet) announce(t("{name} uploaded", { name: item.file.name }));
  }

  refused(item, err, quiet = false) {
    item.cancelButton.hidden = true;
    item.row.classList.add("failed");
    item.bar.hidden = true;
    item.status.replaceChildren(icon("alert"), h("span", { text: err.message }));
    if (quiet) return; // an old outcome: shown, not alerted
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
          if (item.cancelling) this.cancelJob(item); // Cancel was pressed while the bytes were going
          else if (job.state === "queued") item.status.textContent = t("Waiting to be indexed…"); // behind another job of the index
        },
      );
      const chunks = answer?.chunks ?? answer?.document?.chunks;
      this.indexed(item, chunks);
    } catch (err) {
      if (await this.wasCancelled(item, err)) this.cancelled(item);
      else this.refused(item, err);
    }
    item.done = true;
    item.endedAt = Date.now();
    await this.onDone(item);
  }
}
