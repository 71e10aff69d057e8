// Admin settings: the defaults the gateway sends with every turn (models, switches, prompts).
// The form is built from whatever GET /api/settings returns, so a new setting needs no UI change:
// booleans become switches, numbers number fields, long or prompt-like text a textarea, objects a group.

import { api } from "../api.js";
import { announce, h, icon, mount } from "../dom.js";

const LABELS = {
  generation_model: "Answer model",
  utility_model: "Utility model (rewrite, triage, titles)",
  top_k: "Passages per answer",
  hyde: "HyDE search passage",
  rerank: "Rerank passages",
  rewrite: "Rewrite follow-up questions",
  provenance: "Provenance scoring",
};

function labelFor(key) {
  return LABELS[key] || key.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
}

export class SettingsView {
  constructor(shell) {
    this.shell = shell;
    this.values = null;
    this.body = h("div", { class: "settings-body" }, h("p", { class: "muted", text: "Loading…" }));
    this.element = h(
      "section",
      { class: "page settings-view", "aria-labelledby": "settings-title" },
      shell.header(h("h1", { class: "topbar-title", id: "settings-title", text: "Settings" })),
      h("div", { class: "page-body narrow" }, this.body),
    );
  }

  async start() {
    document.title = "Settings · RAG Chat";
    try {
      this.values = await api.getSettings();
    } catch (err) {
      if (err.status === 403) mount(this.body, h("p", { class: "notice", text: "Only an administrator can change settings." }));
      else if (err.status !== 401) mount(this.body, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    this.render();
  }

  render() {
    const status = h("p", { class: "save-status", role: "status" });
    const form = h(
      "form",
      {
        class: "settings-form",
        onsubmit: async (event) => {
          event.preventDefault();
          status.textContent = "Saving…";
          status.className = "save-status";
          try {
            const saved = await api.putSettings(readGroup(form, this.values, ""));
            if (saved && typeof saved === "object") this.values = saved;
            status.replaceChildren(icon("check"), h("span", { text: "Saved. New turns use these settings." }));
            status.className = "save-status ok";
            announce("Settings saved");
          } catch (err) {
            status.textContent = err.message;
            status.className = "save-status form-error";
          }
        },
      },
      p("These are the defaults the gateway sends with every chat turn."),
      renderGroup(this.values, ""),
      h("div", { class: "form-actions" }, status, h("button", { class: "button primary", type: "submit", text: "Save settings" })),
    );
    mount(this.body, form);
  }
}

function p(text) {
  return h("p", { class: "muted", text });
}

function fieldId(path) {
  return `setting-${path.replace(/[^A-Za-z0-9_-]/g, "-")}`;
}

function renderGroup(values, prefix) {
  const scalars = [];
  const groups = [];
  for (const [key, value] of Object.entries(values || {})) {
    const path = prefix ? `${prefix}.${key}` : key;
    if (value && typeof value === "object" && !Array.isArray(value)) {
      groups.push(h("fieldset", { class: "card settings-group" }, h("legend", { text: labelFor(key) }), renderGroup(value, path)));
    } else {
      scalars.push(renderField(key, value, path));
    }
  }
  return [scalars.length ? h("div", { class: "settings-fields" }, scalars) : null, ...groups];
}

function renderField(key, value, path) {
  const id = fieldId(path);
  const isPrompt = /prompt|template|instruction/i.test(path);
  if (typeof value === "boolean") {
    return h(
      "label",
      { class: "switch-field", for: id },
      h("input", { type: "checkbox", role: "switch", id, checked: value, dataset: { path, kind: "boolean" } }),
      h("span", { class: "switch", "aria-hidden": "true" }),
      h("span", { text: labelFor(key) }),
    );
  }
  let input;
  if (typeof value === "number") {
    input = h("input", { class: "input", type: "number", step: "any", id, value: String(value), dataset: { path, kind: "number" } });
  } else if (Array.isArray(value)) {
    input = h("input", { class: "input", id, value: value.join(", "), dataset: { path, kind: "list" } });
  } else if (isPrompt || (typeof value === "string" && value.length > 80)) {
    input = h("textarea", { class: "input prompt", id, rows: 6, value: value ?? "", dataset: { path, kind: value === null ? "nullable" : "string" } });
  } else {
    input = h("input", { class: "input", id, value: value ?? "", placeholder: value === null ? "default" : "", dataset: { path, kind: value === null ? "nullable" : "string" } });
  }
  return h("label", { class: `field${isPrompt ? " wide" : ""}`, for: id }, h("span", { text: labelFor(key) }), input);
}

function readGroup(form, values, prefix) {
  const out = {};
  for (const [key, value] of Object.entries(values || {})) {
    const path = prefix ? `${prefix}.${key}` : key;
    if (value && typeof value === "object" && !Array.isArray(value)) {
      out[key] = readGroup(form, value, path);
      continue;
    }
    const input = form.querySelector(`[data-path="${CSS.escape(path)}"]`);
    if (!input) continue;
    const kind = input.dataset.kind;
    if (kind === "boolean") out[key] = input.checked;
    else if (kind === "number") out[key] = input.value === "" ? null : Number(input.value);
    else if (kind === "list") out[key] = input.value.split(",").map((s) => s.trim()).filter(Boolean);
    else if (kind === "nullable") out[key] = input.value.trim() === "" ? null : input.value;
    else out[key] = input.value;
  }
  return out;
}
