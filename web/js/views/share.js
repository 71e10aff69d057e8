// The Share dialog of an index (its owner or an administrator): who it is shared with and as what (reader:
// ask, see and download; editor: also upload, delete documents, rebuild, rename), add people, groups or everyone
// signed in, change a role, remove a share. Every change is the gateway's (and in its audit log) at once.

import { api } from "../api.js";
import { confirmDialog, customDialog } from "../dialogs.js";
import { announce, h, icon, mount } from "../dom.js";

const ROLES = [
  ["reader", "Can ask"],
  ["editor", "Can edit"],
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
  const list = h("ul", { class: "grant-list", role: "list", "aria-label": "Shared with" });
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
            const who = grant.subject_type === "everyone" ? "Everyone signed in" : grant.subject_name;
            const kind = grant.subject_type === "group" ? "group" : grant.subject_type === "user" ? "person" : "";
            return h(
              "li",
              { class: "grant-row", dataset: { subject: grant.subject_name, kind: grant.subject_type } },
              h("span", { class: "grant-who" }, h("strong", { text: who }), kind ? h("span", { class: "muted small", text: ` ${kind}` }) : null),
              roleSelect(grant.role, `Role of ${who}`, async (role) => {
                error.hidden = true;
                try {
                  await api.updateGrant(index.id, grant.id, role);
                  announce(`${who} ${role === "editor" ? "can edit" : "can ask"}`);
                } catch (err) {
                  fail(err);
                }
              }),
              h(
                "button",
                {
                  class: "icon-button small",
                  type: "button",
                  "aria-label": `Stop sharing with ${who}`,
                  title: "Remove",
                  onclick: async () => {
                    error.hidden = true;
                    try {
                      await api.removeGrant(index.id, grant.id);
                      announce(`No longer shared with ${who}`);
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
        : h("li", { class: "muted", text: "Only you (and administrators) can use this index." }),
    );
  };

  const kind = h(
    "select",
    { class: "input", id: "share-kind", "aria-label": "Share with", onchange: () => showKind() },
    h("option", { value: "user", text: "A person" }),
    h("option", { value: "group", text: "A group", disabled: !groups.length }),
    h("option", { value: "everyone", text: "Everyone signed in" }),
  );
  const username = h("input", { class: "input", id: "share-username", placeholder: "username", autocomplete: "off", "aria-label": "Username" });
  const group = h(
    "select",
    { class: "input", id: "share-group", "aria-label": "Group", hidden: true },
    groups.map((g) => h("option", { value: String(g.id), text: g.name })),
  );
  const role = roleSelect("reader", "Role");
  role.id = "share-role";
  const showKind = () => {
    username.hidden = kind.value !== "user";
    group.hidden = kind.value !== "group";
  };

  const newOwner = h("input", { class: "input", id: "transfer-username", placeholder: "username", autocomplete: "off", "aria-label": "New owner" });
  const transfer = async (close) => {
    const name = newOwner.value.trim();
    if (!name) {
      newOwner.focus();
      return;
    }
    const ok = await confirmDialog({
      title: `Give “${index.name}” to ${name}?`,
      message: "They become its owner; you keep editor access (they can remove it).",
      confirm: "Transfer",
      danger: true,
    });
    if (!ok) return;
    error.hidden = true;
    try {
      await api.transferIndex(index.id, name);
      announce(`${index.name} now belongs to ${name}`);
      close("transferred");
    } catch (err) {
      fail(err);
    }
  };

  return customDialog(`Share “${index.name}”`, (close) => {
    refresh();
    return h(
      "div",
      { class: "share-dialog" },
      h("h3", { class: "scope-heading", text: "Shared with" }),
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
              announce(`Shared ${index.name}`);
            } catch (err) {
              fail(err);
            }
            await refresh();
          },
        },
        h("h3", { class: "scope-heading", text: "Add" }),
        h("div", { class: "share-add" }, kind, username, group, role, h("button", { class: "button primary", type: "submit", text: "Share" })),
        h("p", { class: "hint muted", text: "Can ask: chat with it, see and download its documents. Can edit: also upload, delete and rebuild." }),
      ),
      h(
        "details",
        { class: "transfer" },
        h("summary", { text: "Transfer ownership" }),
        h(
          "div",
          { class: "share-add" },
          newOwner,
          h("button", { class: "button danger", type: "button", text: "Transfer", onclick: () => transfer(close) }),
        ),
      ),
      error,
      h("div", { class: "modal-actions" }, h("button", { class: "button ghost", type: "button", text: "Done", onclick: () => close("done") })),
    );
  });
}
