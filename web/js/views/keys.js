// API keys: every user's own (GATEWAY_API.md, /api/keys). A key signs a program in as this user, on /api and on
// the OpenAI-compatible /v1; its secret is shown once, right after it is made (the gateway keeps only a hash),
// with a copy button. The list shows each key's prefix, when it was made, last used and expires; revoking one
// stops it at once.

import { api } from "../api.js";
import { confirmDialog } from "../dialogs.js";
import { announce, h, icon, mount, relativeTime } from "../dom.js";
import { formatDate, t } from "../i18n.js";

const EXPIRIES = [
  ["never", t("Never")],
  ["30", t("In 30 days")],
  ["90", t("In 90 days")],
  ["365", t("In a year")],
  ["date", t("On a date…")],
];

function expiryFrom(choice, date) {
  if (choice === "never") return null;
  if (choice === "date") {
    if (!date) return undefined;
    // The end of the chosen day, in this browser's time zone.
    const end = new Date(`${date}T23:59:59`);
    return Number.isNaN(end.getTime()) ? undefined : end.toISOString();
  }
  return new Date(Date.now() + Number(choice) * 86400 * 1000).toISOString();
}

function when(value, empty) {
  if (!value) return h("span", { class: "muted", text: empty });
  return h("time", { datetime: value, title: formatDate(value, { time: true }), text: relativeTime(value) });
}

function expires(key) {
  if (!key.expires_at) return h("span", { class: "muted", text: t("never") });
  const date = new Date(key.expires_at);
  if (key.expired) return h("span", { class: "tag danger-text", text: t("expired {date}", { date: formatDate(date) }) });
  return h("time", { datetime: key.expires_at, title: formatDate(date, { time: true }), text: formatDate(date) });
}

async function copyText(text, input) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // No clipboard API (a plain-http address that is not localhost): select it and copy the old way.
    input.focus();
    input.select();
    try {
      return document.execCommand("copy");
    } catch {
      return false;
    }
  }
}

export class KeysView {
  constructor(shell) {
    this.shell = shell;
    this.secretBox = h("div", { class: "key-secret-box" });
    this.list = h("div", { class: "keys-list" }, h("p", { class: "muted", text: t("Loading…") }));
    this.element = h(
      "section",
      { class: "page keys-view", "aria-labelledby": "keys-title" },
      shell.header(h("h1", { class: "topbar-title", id: "keys-title", text: t("API keys") })),
      h("div", { class: "page-body narrow" }, h("div", { class: "settings-body" }, this.createForm(), this.secretBox, this.list)),
    );
  }

  start() {
    document.title = t("API keys · RAG Chat");
    this.refresh();
  }

  createForm() {
    const name = h("input", { class: "input", id: "key-name", name: "name", required: true, maxlength: 100, autocomplete: "off", placeholder: t("e.g. nightly report") });
    const expiry = h(
      "select",
      { class: "input", id: "key-expiry", name: "expiry" },
      EXPIRIES.map(([value, label]) => h("option", { value, text: label })),
    );
    const date = h("input", { class: "input", id: "key-expiry-date", type: "date", hidden: true, "aria-label": t("Expiry date") });
    expiry.addEventListener("change", () => {
      date.hidden = expiry.value !== "date";
      if (!date.hidden) date.focus();
    });
    const readOnly = h("input", { type: "checkbox", id: "key-read-only", name: "read_only" });
    const error = h("p", { class: "form-error", role: "alert", hidden: true });
    const submit = h("button", { class: "button primary", type: "submit" }, icon("plus"), h("span", { text: t("Create key") }));
    const form = h(
      "form",
      {
        class: "card settings-group create-key",
        "aria-labelledby": "new-key-title",
        onsubmit: async (event) => {
          event.preventDefault();
          error.hidden = true;
          const expiresAt = expiryFrom(expiry.value, date.value);
          if (expiresAt === undefined) {
            error.textContent = t("Choose the date the key expires.");
            error.hidden = false;
            return;
          }
          submit.disabled = true;
          try {
            const created = await api.createKey({ name: name.value.trim(), expires_at: expiresAt, read_only: readOnly.checked });
            form.reset();
            date.hidden = true;
            this.showSecret(created);
            this.refresh();
          } catch (err) {
            error.textContent = err.message;
            error.hidden = false;
          } finally {
            submit.disabled = false;
          }
        },
      },
      h("h2", { class: "legend", id: "new-key-title", text: t("New API key") }),
      h(
        "p",
        { class: "muted small", text: t("A key lets a program use this account: the API, and the OpenAI-compatible /v1 (its models are your indexes). It acts with your rights as they are at each request.") },
      ),
      h("label", { class: "field", for: "key-name" }, h("span", { text: t("Name") }), name),
      h("label", { class: "field", for: "key-expiry" }, h("span", { text: t("Expires") }), expiry, date),
      h(
        "label",
        { class: "switch-field", for: "key-read-only" },
        readOnly,
        h("span", { class: "switch", "aria-hidden": "true" }),
        h("span", { text: t("Read-only: it can ask and read, not upload, delete or change anything") }),
      ),
      error,
      h("div", {}, submit),
    );
    return form;
  }

  showSecret(created) {
    const input = h("input", { class: "input mono key-secret", id: "key-secret", readonly: true, value: created.key, "aria-label": t("The new key"), spellcheck: false });
    const copied = h("span", { class: "muted small", role: "status" });
    mount(
      this.secretBox,
      h(
        "section",
        { class: "card settings-group key-created", "aria-labelledby": "key-created-title" },
        h("h2", { class: "legend", id: "key-created-title", text: t("Key “{name}” created", { name: created.name }) }),
        h("p", { class: "notice", text: t("Copy it now: this is the only time it is shown. Anyone holding it can act as you until you revoke it.") }),
        h(
          "div",
          { class: "key-secret-row" },
          input,
          h(
            "button",
            {
              class: "button",
              type: "button",
              onclick: async () => {
                const ok = await copyText(created.key, input);
                copied.textContent = ok ? t("Copied") : t("Select the key and copy it");
                announce(copied.textContent);
              },
            },
            icon("check"),
            h("span", { text: t("Copy") }),
          ),
          copied,
        ),
        h("p", { class: "muted small" }, t("Use it as "), h("code", { text: t("Authorization: Bearer <key>") }), t(", e.g. with an OpenAI client: base URL {url}.", { url: `${location.origin}/v1` })),
        h("button", { class: "button ghost", type: "button", text: t("Done, I have stored it"), onclick: () => mount(this.secretBox) }),
      ),
    );
    queueMicrotask(() => input.select());
    announce(t("Key {name} created. Copy it now: it is shown only once.", { name: created.name }));
  }

  async refresh() {
    let keys;
    try {
      keys = await api.listKeys();
    } catch (err) {
      if (err.status !== 401) mount(this.list, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    const rows = keys.map((key) =>
      h(
        "tr",
        { dataset: { keyId: String(key.id), keyName: key.name } },
        h("td", { class: "key-name", text: key.name }),
        h("td", {}, h("code", { class: "key-prefix", text: `${key.prefix}…` })),
        h("td", { text: key.read_only ? t("read-only") : t("full") }),
        h("td", {}, when(key.created_at, "")),
        h("td", {}, when(key.last_used_at, t("never"))),
        h("td", {}, expires(key)),
        h(
          "td",
          {},
          h("button", {
            class: "button small danger",
            type: "button",
            text: t("Revoke"),
            "aria-label": t("Revoke {name}", { name: key.name }),
            onclick: async () => {
              const sure = await confirmDialog({
                title: t("Revoke “{name}”?", { name: key.name }),
                message: t("Programs using it are refused from now on. This cannot be undone."),
                confirm: t("Revoke"),
                danger: true,
              });
              if (!sure) return;
              try {
                await api.revokeKey(key.id);
                announce(t("{name} revoked", { name: key.name }));
              } catch (err) {
                announce(err.message);
              }
              this.refresh();
            },
          }),
        ),
      ),
    );
    mount(
      this.list,
      h(
        "section",
        { class: "card settings-group", "aria-labelledby": "keys-list-title" },
        h("h2", { class: "legend", id: "keys-list-title", text: t("Your keys") }),
        keys.length
          ? h(
              "div",
              { class: "doc-table-wrap" },
              h(
                "table",
                { class: "doc-table keys-table" },
                h("thead", {}, h("tr", {}, [t("Name"), t("Key"), t("Access"), t("Created"), t("Last used"), t("Expires"), ""].map((label) => h("th", { text: label })))),
                h("tbody", {}, rows),
              ),
            )
          : h("p", { class: "muted empty-keys", text: t("No API keys yet.") }),
      ),
    );
  }

  destroy() {}
}
