// The Share dialog of an index (its owner or an administrator): who it is shared with and as what (reader:
// ask, see and download; editor: also upload, delete documents, rebuild, rename), add people, groups or everyone
// signed in, change a role, remove a share. Every change is the gateway's (and in its audit log) at once.

import { api } from "../api.js";
import { confirmDialog, customDialog } from "../dialogs.js";
import { announce, h, icon, mount } from "../dom.js";
import { t } from "../i18n.js";

const ROLES = [
  ["reader", t("Can ask")],
  ["editor", t("Can edit")],
];

function roleSelect(value, label, onChange) {
  const select = h(
    "select",
    { class: "input small", "aria-label": label, onchange: () => onChange?.(select.value) },
    ROLES.map(([role, text]) => h("option", { value: role, text, selected: role === value })),
  );
  return select;
}

/** Opens the dialog for `index` ({id, name}); resolves `"transferred"` when it was given away, else when closed. */
export async function shareDialog(index) {
  const list = h("ul", { class: "grant-list", role: "list", "aria-label": t("Shared with") });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  let groups = [];
  try {
    groups = await api.listGroups();
  } catch {
    groups = [];
  }

  const fail = (err) => {
    error.textContent = err.message;
    error.hidden = false;
  };

  const refresh = async () => {
    let grants;
    try {
      grants = await api.listGrants(index.id);
    } catch (err) {
      fail(err);
      return;
    }
    mount(
      list,
      grants.length
        ? grants.map((grant) => {
            const who = grant.subject_type === "everyone" ? t("Everyone signed in") : grant.subject_name;
            const kind = grant.subject_type === "group" ? "group" : grant.subject_type === "user" ? "person" : "";
            return h(
              "li",
              { class: "grant-row", dataset: { subject: grant.subject_name, kind: grant.subject_type } },
              h("span", { class: "grant-who" }, h("strong", { text: who }), kind ? h("span", { class: "muted small", text: ` ${kind}` }) : null),
              roleSelect(grant.role, t("Role of {who}", { who }), async (role) => {
                error.hidden = true;
                try {
                  await api.updateGrant(index.id, grant.id, role);
                  announce(role === "editor" ? t("{who} can edit", { who }) : t("{who} can ask", { who }));
                } catch (err) {
                  fail(err);
                }
              }),
              h(
                "button",
                {
                  class: "icon-button small",
                  type: "button",
                  "aria-label": t("Stop sharing with {who}", { who }),
                  title: t("Remove"),
                  onclick: async () => {
                    error.hidden = true;
                    try {
                      await api.removeGrant(index.id, grant.id);
                      announce(t("No longer shared with {who}", { who }));
                    } catch (err) {
                      fail(err);
                    }
                    await refresh();
                  },
                },
                icon("trash"),
              ),
            );
          })
        : h("li", { class: "muted", text: t("Only you (and administrators) can use this index.") }),
    );
  };

  const kind = h(
    "select",
    { class: "input", id: "share-kind", "aria-label": t("Share with"), onchange: () => showKind() },
    h("option", { value: "user", text: t("A person") }),
    h("option", { value: "group", text: t("A group"), disabled: !groups.length }),
    h("option", { value: "everyone", text: t("Everyone signed in") }),
  );
  const username = h("input", { class: "input", id: "share-username", placeholder: t("username"), autocomplete: "off", "aria-label": t("Username") });
  const group = h(
    "select",
    { class: "input", id: "share-group", "aria-label": t("Group"), hidden: true },
    groups.map((g) => h("option", { value: String(g.id), text: g.name })),
  );
  const role = roleSelect("reader", t("Role"));
  role.id = "share-role";
  const showKind = () => {
    username.hidden = kind.value !== "user";
    group.hidden = kind.value !== "group";
  };

  const newOwner = h("input", { class: "input", id: "transfer-username", placeholder: t("username"), autocomplete: "off", "aria-label": t("New owner") });
  const transfer = async (close) => {
    const name = newOwner.value.trim();
    if (!name) {
      newOwner.focus();
      return;
    }
    const ok = await confirmDialog({
      title: t("Give “{name}” to {who}?", { name: index.name, who: name }),
      message: t("They become its owner; you keep editor access (they can remove it)."),
      confirm: t("Transfer"),
      danger: true,
    });
    if (!ok) return;
    error.hidden = true;
    try {
      await api.transferIndex(index.id, name);
      announce(t("{name} now belongs to {who}", { name: index.name, who: name }));
      close("transferred");
    } catch (err) {
      fail(err);
    }
  };

  return customDialog(t("Share “{name}”", { name: index.name }), (close) => {
    refresh();
    return h(
      "div",
      { class: "share-dialog" },
      h("h3", { class: "scope-heading", text: t("Shared with") }),
      list,
      h(
        "form",
        {
          class: "share-form",
          onsubmit: async (event) => {
            event.preventDefault();
            error.hidden = true;
            const grant = { subject_type: kind.value, role: role.value };
            if (kind.value === "user") {
              if (!username.value.trim()) {
                username.focus();
                return;
              }
              grant.username = username.value.trim();
            } else if (kind.value === "group") grant.group_id = Number(group.value);
            try {
              await api.addGrant(index.id, grant);
              username.value = "";
              announce(t("Shared {name}", { name: index.name }));
            } catch (err) {
              fail(err);
            }
            await refresh();
          },
        },
        h("h3", { class: "scope-heading", text: t("Add") }),
        h("div", { class: "share-add" }, kind, username, group, role, h("button", { class: "button primary", type: "submit", text: t("Share") })),
        h("p", { class: "hint muted", text: t("Can ask: chat with it, see and download its documents. Can edit: also upload, delete and rebuild.") }),
      ),
      h(
        "details",
        { class: "transfer" },
        h("summary", { text: t("Transfer ownership") }),
        h(
          "div",
          { class: "share-add" },
          newOwner,
          h("button", { class: "button danger", type: "button", text: t("Transfer"), onclick: () => transfer(close) }),
        ),
      ),
      error,
      h("div", { class: "modal-actions" }, h("button", { class: "button ghost", type: "button", text: t("Done"), onclick: () => close("done") })),
    );
  });
}
