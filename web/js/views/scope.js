// Which documents a chat searches: its indexes, and datasets within them (none ticked = all of them).

import { api } from "../api.js";
import { customDialog } from "../dialogs.js";
import { h } from "../dom.js";
import { t } from "../i18n.js";

/** "All documents", "2 datasets", "No documents": the label on the chat's scope button. */
export function scopeLabel(indexIds, datasets, indexes) {
  if (!indexIds.length) return t("No documents");
  if (datasets.length) return datasets.length === 1 ? t("Dataset: {name}", { name: datasets[0] }) : t("{count} datasets", { count: datasets.length });
  if (indexes && indexIds.length === 1) {
    const index = indexes.find((i) => String(i.id) === String(indexIds[0]));
    if (index) return t("Index: {name}", { name: index.name });
  }
  return indexes && indexIds.length === indexes.length ? t("All documents") : t("{count} indexes", { count: indexIds.length });
}

/**
 * Opens the scope picker; resolves `{index_ids, datasets}` when saved, or null when cancelled.
 * Datasets are listed for the ticked indexes and reloaded as indexes are ticked.
 */
export async function pickScope({ indexIds, datasets }) {
  const indexes = await api.listIndexes();
  const chosenIndexes = new Set(indexIds.map(String));
  const chosenDatasets = new Set(datasets);
  const datasetBox = h("div", { class: "scope-datasets" });
  const datasetCache = new Map();
  let result = null;

  const loadDatasets = async () => {
    const names = new Set();
    for (const id of chosenIndexes) {
      if (!datasetCache.has(id)) {
        try {
          datasetCache.set(id, await api.listDatasets(id));
        } catch {
          datasetCache.set(id, []);
        }
      }
      for (const name of datasetCache.get(id)) names.add(typeof name === "string" ? name : name.name);
    }
    const sorted = [...names].sort();
    for (const name of [...chosenDatasets]) if (!names.has(name)) chosenDatasets.delete(name);
    datasetBox.replaceChildren(
      h("h3", { class: "scope-heading", id: "scope-datasets-label", text: t("Datasets") }),
      sorted.length
        ? h(
            "div",
            { class: "check-grid", role: "group", "aria-labelledby": "scope-datasets-label" },
            sorted.map((name) =>
              checkbox(name, chosenDatasets.has(name), (on) => (on ? chosenDatasets.add(name) : chosenDatasets.delete(name)), "dataset"),
            ),
          )
        : h("p", { class: "muted", text: chosenIndexes.size ? t("These indexes have no datasets yet.") : t("Pick an index first.") }),
      h("p", { class: "hint muted", text: t("Tick none to search every dataset of the chosen indexes.") }),
    );
  };

  await loadDatasets();
  await customDialog(t("Documents for this chat"), (close) =>
    h(
      "form",
      {
        class: "scope-form",
        onsubmit: (event) => {
          event.preventDefault();
          result = { index_ids: [...chosenIndexes].map(idValue(indexes)), datasets: [...chosenDatasets] };
          close("ok");
        },
      },
      h("h3", { class: "scope-heading", id: "scope-indexes-label", text: t("Indexes") }),
      indexes.length
        ? h(
            "div",
            { class: "check-grid", role: "group", "aria-labelledby": "scope-indexes-label" },
            indexes.map((index) =>
              checkbox(index.name, chosenIndexes.has(String(index.id)), (on) => {
                if (on) chosenIndexes.add(String(index.id));
                else chosenIndexes.delete(String(index.id));
                loadDatasets();
              }, "index", index.via && index.via !== "owner" ? index.owner : ""),
            ),
          )
        : h("p", { class: "muted" }, t("No indexes yet. Create one under "), h("a", { href: "#/documents", text: t("Documents") }), "."),
      datasetBox,
      h(
        "div",
        { class: "modal-actions" },
        h("button", { class: "button ghost", type: "button", text: t("Cancel"), onclick: () => close("cancel") }),
        h("button", { class: "button primary", type: "submit", text: t("Save") }),
      ),
    ),
  );
  return result;
}

// Index ids go back with the type the server gave them (numbers stay numbers).
function idValue(indexes) {
  return (id) => indexes.find((index) => String(index.id) === id)?.id ?? id;
}

function checkbox(label, checked, onChange, kind, owner = "") {
  const input = h("input", { type: "checkbox", checked, dataset: { kind, name: label }, onchange: () => onChange(input.checked) });
  // A shared index shows whose it is (two people may both have a "handbook").
  return h("label", { class: "check" }, input, h("span", { text: label }), owner ? h("span", { class: "muted small", text: ` · ${owner}` }) : null);
}
