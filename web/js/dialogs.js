// Modal confirm / prompt built on <dialog>: focus is trapped, Escape cancels, focus returns to the opener.

import { h } from "./dom.js";
import { t } from "./i18n.js";

function open(dialog) {
  const opener = document.activeElement;
  document.body.append(dialog);
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      dialog.remove();
      if (opener instanceof HTMLElement) opener.focus();
      resolve(dialog.returnValue);
    });
  });
}

/** Resolves true when the user confirms. `danger` styles the confirm button as destructive. */
export async function confirmDialog({ title, message, confirm = "OK", danger = false }) {
  const dialog = h(
    "dialog",
    { class: "modal", "aria-labelledby": "modal-title" },
    h(
      "form",
      { method: "dialog" },
      h("h2", { id: "modal-title", text: title }),
      message ? h("p", { class: "muted", text: message }) : null,
      h(
        "div",
        { class: "modal-actions" },
        h("button", { class: "button ghost", value: "cancel", text: t("Cancel") }),
        h("button", { class: `button ${danger ? "danger" : "primary"}`, value: "ok", text: confirm }),
      ),
    ),
  );
  return (await open(dialog)) === "ok";
}

/** Resolves the entered text, or null when cancelled. */
export async function promptDialog({ title, label, value = "", confirm = t("Save") }) {
  const input = h("input", { class: "input", name: "value", value, required: true, autocomplete: "off" });
  const dialog = h(
    "dialog",
    { class: "modal", "aria-labelledby": "modal-title" },
    h(
      "form",
      { method: "dialog" },
      h("h2", { id: "modal-title", text: title }),
      h("label", { class: "field" }, h("span", { text: label }), input),
      h(
        "div",
        { class: "modal-actions" },
        h("button", { class: "button ghost", value: "cancel", formnovalidate: true, text: t("Cancel") }),
        h("button", { class: "button primary", value: "ok", text: confirm }),
      ),
    ),
  );
  queueMicrotask(() => input.select());
  const result = await open(dialog);
  return result === "ok" ? input.value.trim() : null;
}

/** A modal with arbitrary content; `build(close)` returns the form body. Resolves the return value. */
export function customDialog(title, build) {
  const dialog = h("dialog", { class: "modal wide", "aria-labelledby": "modal-title" });
  const close = (value = "") => dialog.close(value);
  dialog.append(h("h2", { id: "modal-title", text: title }), build(close));
  return open(dialog);
}
