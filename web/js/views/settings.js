// Settings. Everyone: their account (change password, which signs out every other session).
// Admins also: the accounts on this server (disable / enable, which ends the account's sessions), the turn
// options the gateway sends with every chat turn (GET/PUT /api/settings), and what users may choose per turn:
// the allowed models (besides the worker's own) and the prompt presets (users may not override prompts). Every turn option may be left on
// "default", which leaves the worker's own default in force; the worker's effective defaults
// (`worker_defaults`, from its /config, shown to admins only) appear next to each field.

import { api, session } from "../api.js";
import { confirmDialog } from "../dialogs.js";
import { announce, h, icon, mount } from "../dom.js";
import { currentLocale, LOCALES, setLocale, t } from "../i18n.js";

const SWITCHES = [
  ["rewrite", t("Rewrite follow-up questions"), t("Turns “and the second one?” into a standalone search query.")],
  ["hyde", t("HyDE"), t("Searches with a drafted answer passage as well as the question.")],
  ["rerank", t("Rerank passages"), t("Orders candidate passages with the cross-encoder before answering.")],
];
const PROVENANCE = ["rerank", "similarity", "none"];

export class SettingsView {
  constructor(shell) {
    this.shell = shell;
    this.body = h("div", { class: "settings-body" }, h("p", { class: "muted", text: t("Loading…") }));
    this.element = h(
      "section",
      { class: "page settings-view", "aria-labelledby": "settings-title" },
      shell.header(h("h1", { class: "topbar-title", id: "settings-title", text: t("Settings") })),
      h("div", { class: "page-body narrow" }, this.body),
    );
  }

  async start() {
    document.title = t("Settings · RAG Chat");
    this.defaults = h("div", { class: "turn-defaults" });
    this.accounts = h("div", { class: "accounts" });
    const admin = Boolean(session.user?.is_admin);
    mount(this.body, languageForm(), passwordForm(), admin ? this.accounts : null, admin ? this.defaults : null);
    if (!admin) return;
    this.renderAccounts();
    let data;
    try {
      data = await api.getSettings();
    } catch (err) {
      if (err.status !== 401) mount(this.defaults, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    this.options = data?.options || {};
    this.worker = data?.worker_defaults || null;
    this.allowedModels = data?.allowed_models || [];
    this.presets = data?.prompt_presets || {};
    this.render();
  }

  async renderAccounts() {
    let users;
    try {
      users = await api.listUsers();
    } catch (err) {
      if (err.status !== 401) mount(this.accounts, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    const rows = users.map((user) => {
      const self = user.id === session.user?.id;
      const button = self
        ? h("span", { class: "muted", text: t("you") })
        : h("button", {
            class: `button small${user.disabled ? "" : " danger"}`,
            type: "button",
            text: user.disabled ? t("Enable") : t("Disable"),
            "aria-label": `${user.disabled ? t("Enable") : t("Disable")} ${user.username}`,
            onclick: async () => {
              if (
                !user.disabled &&
                !(await confirmDialog({
                  title: t("Disable {username}?", { username: user.username }),
                  message: t("They are signed out everywhere and cannot sign in until enabled again."),
                  confirm: t("Disable"),
                  danger: true,
                }))
              )
                return;
              try {
                await api.setUserDisabled(user.id, !user.disabled);
                announce(user.disabled ? t("{username} enabled", { username: user.username }) : t("{username} disabled", { username: user.username }));
              } catch (err) {
                announce(err.message);
              }
              this.renderAccounts();
            },
          });
      return h(
        "tr",
        { dataset: { username: user.username } },
        h("td", { text: user.username }),
        h("td", { text: user.is_admin ? t("admin") : t("user") }),
        h("td", { class: "account-state", text: user.disabled ? t("disabled") : t("active") }),
        h("td", {}, button),
      );
    });
    mount(
      this.accounts,
      h(
        "section",
        { class: "card settings-group", "aria-labelledby": "accounts-title" },
        h("h2", { class: "legend", id: "accounts-title", text: t("Accounts") }),
        h(
          "table",
          { class: "doc-table accounts-table" },
          h("thead", {}, h("tr", {}, [t("Name"), t("Role"), t("State"), ""].map((label) => h("th", { text: label })))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }

  render() {
    const defaults = this.worker?.defaults || {};
    const workerSettings = this.worker?.settings || {};
    const prompts = this.worker?.prompts || {};
    const o = this.options;
    const status = h("p", { class: "save-status", role: "status" });

    const model = h("input", {
      class: "input",
      id: "setting-model",
      value: o.model ?? "",
      placeholder: workerSettings.generation_model ? t("default: {value}", { value: workerSettings.generation_model }) : t("worker default"),
      autocomplete: "off",
    });
    const temperature = h("input", {
      class: "input",
      id: "setting-temperature",
      type: "number",
      min: 0,
      max: 2,
      step: 0.1,
      value: o.temperature ?? "",
      placeholder: t("model default"),
    });
    const topK = h("input", {
      class: "input",
      id: "setting-top_k",
      type: "number",
      min: 1,
      max: 50,
      step: 1,
      value: o.top_k ?? "",
      placeholder: defaults.top_k ? t("default: {value}", { value: defaults.top_k }) : t("worker default"),
    });
    const provenance = select(
      "setting-provenance",
      [["", `${t("Default")}${defaults.provenance ? ` (${defaults.provenance})` : ""}`], ...PROVENANCE.map((p) => [p, p])],
      o.provenance ?? "",
    );
    const switches = SWITCHES.map(([key, label, help]) => {
      const fallback = typeof defaults[key] === "boolean" ? ` (${defaults[key] ? t("on") : t("off")})` : "";
      const value = typeof o[key] === "boolean" ? (o[key] ? "on" : "off") : "";
      return { key, control: select(`setting-${key}`, [["", `${t("Default")}${fallback}`], ["on", t("On")], ["off", t("Off")]], value), label, help };
    });

    const promptNames = [...new Set([...Object.keys(prompts), ...Object.keys(o.prompts || {})])];
    const promptFields = promptNames.map((name) => {
      const fallback = prompts[name] ?? "";
      const area = h("textarea", {
        class: "input prompt",
        id: `setting-prompt-${name}`,
        rows: 6,
        value: o.prompts?.[name] ?? fallback,
        dataset: { prompt: name },
      });
      const badge = h("span", { class: "tag" });
      const sync = () => {
        const custom = area.value !== fallback;
        badge.textContent = custom ? "customised" : "default";
        badge.classList.toggle("accent", custom);
      };
      area.addEventListener("input", sync);
      sync();
      return {
        name,
        area,
        fallback,
        element: h(
          "div",
          { class: "field wide prompt-field" },
          h(
            "div",
            { class: "prompt-head" },
            h("label", { for: area.id, text: t("{name} prompt", { name: humanise(name) }) }),
            badge,
            fallback
              ? h("button", {
                  class: "link-button small",
                  type: "button",
                  text: t("Reset to default"),
                  onclick: () => {
                    area.value = fallback;
                    sync();
                  },
                })
              : null,
          ),
          area,
        ),
      };
    });

    const allowedModels = h("textarea", {
      class: "input",
      id: "setting-allowed_models",
      rows: 3,
      value: this.allowedModels.join("\n"),
      placeholder: t("one model per line, e.g. llama3.2:3b"),
    });
    const presets = h("textarea", {
      class: "input prompt",
      id: "setting-prompt_presets",
      rows: 6,
      value: Object.keys(this.presets).length ? JSON.stringify(this.presets, null, 2) : "",
      placeholder: '{"brief": {"system": "Answer in two sentences, citing the sources."}}',
    });

    const form = h(
      "form",
      {
        class: "settings-form",
        onsubmit: async (event) => {
          event.preventDefault();
          const options = {};
          if (model.value.trim()) options.model = model.value.trim();
          if (temperature.value !== "") options.temperature = Number(temperature.value);
          if (topK.value !== "") options.top_k = Number(topK.value);
          if (provenance.value) options.provenance = provenance.value;
          for (const { key, control } of switches) if (control.value) options[key] = control.value === "on";
          const custom = {};
          for (const { name, area, fallback } of promptFields) if (area.value !== fallback) custom[name] = area.value;
          if (Object.keys(custom).length) options.prompts = custom;
          const allowed = allowedModels.value.split(/[\s,]+/).filter(Boolean);
          let promptPresets = {};
          if (presets.value.trim()) {
            try {
              promptPresets = JSON.parse(presets.value);
            } catch (err) {
              status.textContent = t("Prompt presets: not valid JSON ({message}).", { message: err.message });
              status.className = "save-status form-error";
              presets.focus();
              return;
            }
          }
          status.textContent = t("Saving…");
          status.className = "save-status";
          try {
            const saved = await api.putSettings({ options, allowed_models: allowed, prompt_presets: promptPresets });
            this.options = saved?.options || options;
            this.allowedModels = saved?.allowed_models || allowed;
            this.presets = saved?.prompt_presets || promptPresets;
            status.replaceChildren(icon("check"), h("span", { text: t("Saved. New turns use these settings.") }));
            status.className = "save-status ok";
            announce(t("Settings saved"));
          } catch (err) {
            status.textContent = err.status === 403 ? t("Only an administrator can change settings.") : err.message;
            status.className = "save-status form-error";
          }
        },
      },
      h("p", { class: "muted", text: t("Defaults the gateway sends with every chat turn. Leave a field on default to use the worker's own setting.") }),
      h(
        "fieldset",
        { class: "card settings-group" },
        h("legend", { text: t("Models") }),
        h(
          "div",
          { class: "settings-fields" },
          field("setting-model", t("Answer model"), model, t("An Ollama tag or model id the worker can load.")),
          field("setting-temperature", t("Temperature"), temperature),
          field(
            "setting-allowed_models",
            t("Models users may choose"),
            allowedModels,
            t("Besides the worker's own (its generation and utility models) and the answer model above; a turn naming any other model is refused."),
          ),
        ),
      ),
      h(
        "fieldset",
        { class: "card settings-group" },
        h("legend", { text: t("Retrieval") }),
        h(
          "div",
          { class: "settings-fields" },
          switches.map(({ key, control, label, help }) => field(`setting-${key}`, label, control, help)),
          field("setting-top_k", t("Passages per answer"), topK),
          field("setting-provenance", t("Provenance scoring"), provenance, t("How “used 42%” on source cards is measured.")),
        ),
      ),
      promptFields.length
        ? h("fieldset", { class: "card settings-group" }, h("legend", { text: t("Prompts") }), promptFields.map((p) => p.element))
        : null,
      h(
        "fieldset",
        { class: "card settings-group" },
        h("legend", { text: t("Prompt presets") }),
        h("p", {
          class: "muted",
          text: t("Only administrators may override prompts in a turn; users choose one of these by name (options.prompt_preset). JSON: {example}, prompt names as above.", { example: '{"name": {"prompt": "text"}}' }),
        }),
        h("div", { class: "field wide" }, h("label", { for: presets.id, text: t("Presets (JSON)") }), presets),
      ),
      this.worker ? workerInfo(workerSettings, this.worker.reranker) : h("p", { class: "notice", text: t("The worker did not answer; its defaults are not shown.") }),
      h("div", { class: "form-actions" }, status, h("button", { class: "button primary", type: "submit", text: t("Save settings") })),
    );
    mount(this.defaults, form);
  }
}

// Change password: the gateway ends every other session and answers with a fresh cookie for this one.
/** The interface's language: the browser's by default; a choice here is remembered in this browser. */
function languageForm() {
  const choice = h(
    "select",
    { class: "input", id: "setting-language", onchange: () => setLocale(choice.value) },
    LOCALES.map(([code, name]) => h("option", { value: code, lang: code, selected: code === currentLocale(), text: name })),
  );
  return h(
    "section",
    { class: "card settings-group language-form", "aria-labelledby": "language-title" },
    h("h2", { class: "legend", id: "language-title", text: t("Language") }),
    field("setting-language", t("Interface language"), choice, t("Dates and numbers follow it too. Answers are in the language of your question.")),
  );
}

function passwordForm() {
  const input = (id, label, autocomplete) => {
    const control = h("input", { class: "input", id, type: "password", autocomplete, required: true });
    return { control, element: field(id, label, control) };
  };
  const current = input("password-current", t("Current password"), "current-password");
  const next = input("password-new", t("New password"), "new-password");
  const repeat = input("password-repeat", t("Repeat new password"), "new-password");
  next.control.minLength = 8;
  const status = h("p", { class: "save-status", role: "status" });
  return h(
    "form",
    {
      class: "card settings-group password-form",
      "aria-labelledby": "password-title",
      onsubmit: async (event) => {
        event.preventDefault();
        status.className = "save-status";
        if (next.control.value !== repeat.control.value) {
          status.textContent = t("The new passwords differ.");
          status.className = "save-status form-error";
          repeat.control.focus();
          return;
        }
        status.textContent = t("Saving…");
        try {
          await api.changePassword(current.control.value, next.control.value);
          for (const { control } of [current, next, repeat]) control.value = "";
          status.replaceChildren(icon("check"), h("span", { text: t("Password changed. Your other sessions were signed out.") }));
          status.className = "save-status ok";
          announce(t("Password changed"));
        } catch (err) {
          status.textContent = err.message;
          status.className = "save-status form-error";
          (err.field === "new_password" ? next : current).control.focus();
        }
      },
    },
    h("h2", { class: "legend", id: "password-title", text: session.user ? t("Your account: {username}", { username: session.user.username }) : t("Your account") }),
    h("div", { class: "settings-fields" }, current.element, next.element, repeat.element),
    h("div", { class: "form-actions" }, status, h("button", { class: "button primary", type: "submit", text: t("Change password") })),
  );
}

function field(id, label, control, help = "") {
  return h(
    "div",
    { class: "field" },
    h("label", { for: id, text: label }),
    control,
    help ? h("span", { class: "field-help muted", text: help }) : null,
  );
}

function select(id, choices, value) {
  return h(
    "select",
    { class: "input", id },
    choices.map(([v, label]) => h("option", { value: v, selected: v === value, text: label })),
  );
}

function humanise(name) {
  return name.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
}

// Read-only: what the worker runs with, so an admin sees which models the defaults mean.
function workerInfo(settings, reranker) {
  const keys = ["llm_backend", "generation_model", "utility_model", "embedding_model", "ollama_host", "top_k"];
  const rows = keys.filter((k) => settings[k] !== undefined && settings[k] !== "");
  if (reranker) rows.push("reranker");
  const value = (k) => String(k === "reranker" ? reranker : settings[k]);
  return h(
    "details",
    { class: "card settings-group worker-info" },
    h("summary", { text: t("Worker configuration (read-only)") }),
    h("dl", { class: "kv" }, rows.map((k) => [h("dt", { text: humanise(k) }), h("dd", { text: value(k) })])),
  );
}
