// The Admin area (administrators only): one page with tabs, `#/admin/<tab>`. Built-in tabs: Groups (create,
// rename, delete, members) and Audit log (filters, paging). Other modules add theirs with registerAdminTab
// (e.g. users, API keys) before the page is opened; tabs appear in the order registered.

import { api, session } from "../api.js";
import { confirmDialog, promptDialog } from "../dialogs.js";
import { announce, h, icon, mount, relativeTime } from "../dom.js";
import { replaceRoute } from "../router.js";
import { t } from "../i18n.js";

const TABS = [];

/**
 * Adds a tab to the Admin area: `{id, label, render(root)}`; `render` fills `root` (an element already in the
 * page) and may return a cleanup function, called when the tab or the page is left. Registering an id twice
 * replaces the first.
 */
export function registerAdminTab(tab) {
  const at = TABS.findIndex((t) => t.id === tab.id);
  if (at >= 0) TABS.splice(at, 1, tab);
  else TABS.push(tab);
}

export class AdminView {
  constructor(shell, tabId) {
    this.shell = shell;
    this.tabId = tabId;
    this.tabBar = h("div", { class: "tabs", role: "tablist", "aria-label": t("Admin sections") });
    this.panel = h("div", { class: "tab-panel", role: "tabpanel", tabindex: "-1" });
    this.element = h(
      "section",
      { class: "page admin-view", "aria-labelledby": "admin-title" },
      shell.header(h("h1", { class: "topbar-title", id: "admin-title", text: t("Admin") })),
      h("div", { class: "page-body" }, this.tabBar, this.panel),
    );
    this.cleanup = null;
  }

  start() {
    document.title = t("Admin · RAG Chat");
    if (!session.user?.is_admin) {
      mount(this.panel, h("p", { class: "muted", text: t("Only administrators can open this page.") }));
      return;
    }
    const tab = TABS.find((t) => t.id === this.tabId) || TABS[0];
    if (!tab) return;
    if (tab.id !== this.tabId) replaceRoute(`#/admin/${encodeURIComponent(tab.id)}`);
    mount(
      this.tabBar,
      TABS.map((t) =>
        h("a", {
          class: "tab",
          role: "tab",
          href: `#/admin/${encodeURIComponent(t.id)}`,
          "aria-selected": String(t.id === tab.id),
          "aria-current": t.id === tab.id ? "page" : false,
          text: t.label,
        }),
      ),
    );
    this.panel.setAttribute("aria-label", tab.label);
    const result = tab.render(this.panel);
    this.cleanup = typeof result === "function" ? result : null;
  }

  destroy() {
    this.cleanup?.();
  }
}

// ---- Groups ----------------------------------------------------------------------------------------------------

function renderGroups(root) {
  const list = h("div", { class: "group-list" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const fail = (err) => {
    error.textContent = err.message;
    error.hidden = false;
  };
  const name = h("input", { class: "input", id: "new-group-name", required: true, maxlength: 64, placeholder: t("e.g. support"), autocomplete: "off" });

  const refresh = async () => {
    let groups;
    try {
      groups = await api.listGroups();
    } catch (err) {
      fail(err);
      return;
    }
    mount(
      list,
      groups.length ? groups.map((group) => groupCard(group)) : h("p", { class: "muted", text: t("No groups yet. A group can be given access to indexes in one share.") }),
    );
  };

  const groupCard = (group) => {
    const member = h("input", { class: "input small", placeholder: t("username"), autocomplete: "off", "aria-label": t("Add a member to {name}", { name: group.name }) });
    return h(
      "div",
      { class: "card group-card", dataset: { group: group.name } },
      h(
        "div",
        { class: "group-head" },
        h("h3", { class: "group-name", text: group.name }),
        h("span", { class: "muted small", text: t("{count} members", { count: group.members.length }) }),
        h(
          "button",
          {
            class: "icon-button small",
            type: "button",
            "aria-label": t("Rename {name}", { name: group.name }),
            title: t("Rename"),
            onclick: async () => {
              const value = await promptDialog({ title: t("Rename {name}", { name: group.name }), label: t("Name"), value: group.name });
              if (!value || value === group.name) return;
              try {
                await api.updateGroup(group.id, { name: value });
                announce(t("Renamed to {value}", { value }));
              } catch (err) {
                fail(err);
              }
              await refresh();
            },
          },
          icon("edit"),
        ),
        h(
          "button",
          {
            class: "icon-button small",
            type: "button",
            "aria-label": t("Delete {name}", { name: group.name }),
            title: t("Delete"),
            onclick: async () => {
              const ok = await confirmDialog({
                title: t("Delete the group “{name}”?", { name: group.name }),
                message: t("Its members lose what was shared with the group (their own shares stay)."),
                confirm: t("Delete group"),
                danger: true,
              });
              if (!ok) return;
              try {
                await api.deleteGroup(group.id);
                announce(t("Group {name} deleted", { name: group.name }));
              } catch (err) {
                fail(err);
              }
              await refresh();
            },
          },
          icon("trash"),
        ),
      ),
      h(
        "ul",
        { class: "member-list", role: "list", "aria-label": t("Members of {name}", { name: group.name }) },
        group.members.map((m) =>
          h(
            "li",
            { class: "member", dataset: { member: m.username } },
            h("span", { text: m.username }),
            h(
              "button",
              {
                class: "icon-button small",
                type: "button",
                "aria-label": t("Remove {username} from {name}", { username: m.username, name: group.name }),
                title: t("Remove"),
                onclick: async () => {
                  try {
                    await api.removeMember(group.id, m.id);
                    announce(t("{username} removed from {name}", { username: m.username, name: group.name }));
                  } catch (err) {
                    fail(err);
                  }
                  await refresh();
                },
              },
              icon("close"),
            ),
          ),
        ),
      ),
      h(
        "form",
        {
          class: "member-add",
          onsubmit: async (event) => {
            event.preventDefault();
            error.hidden = true;
            if (!member.value.trim()) return;
            try {
              await api.addMember(group.id, member.value.trim());
              announce(t("{username} added to {name}", { username: member.value.trim(), name: group.name }));
            } catch (err) {
              fail(err);
              return;
            }
            await refresh();
          },
        },
        member,
        h("button", { class: "button small", type: "submit", text: t("Add member") }),
      ),
    );
  };

  mount(
    root,
    h(
      "form",
      {
        class: "card create-group",
        onsubmit: async (event) => {
          event.preventDefault();
          error.hidden = true;
          try {
            const group = await api.createGroup(name.value.trim());
            name.value = "";
            announce(t("Group {name} created", { name: group.name }));
          } catch (err) {
            fail(err);
            return;
          }
          await refresh();
        },
      },
      h("label", { class: "field inline", for: "new-group-name" }, h("span", { text: t("New group") }), name),
      h("button", { class: "button primary", type: "submit" }, icon("plus"), h("span", { text: t("Create group") })),
    ),
    error,
    list,
  );
  refresh();
}

// ---- Audit log ---------------------------------------------------------------------------------------------------

const ACTIONS = [
  ["", t("Every event")],
  ["index.", t("Indexes: shares, transfers, deletions")],
  ["document.", t("Documents deleted")],
  ["group.", t("Groups")],
  ["user.", t("Accounts")],
  ["auth.", t("Sign-in failures")],
  ["key.", t("API keys")],
  ["settings.", t("Settings")],
];

function describe(event) {
  const d = event.detail || {};
  switch (event.action) {
    case "index.grant":
      return d.was
        ? t("shared “{index}” with {subject} as {role} (was {was})", { index: d.index, subject: d.subject, role: d.role, was: d.was })
        : t("shared “{index}” with {subject} as {role}", { index: d.index, subject: d.subject, role: d.role });
    case "index.revoke":
      return t("stopped sharing “{index}” with {subject}", { index: d.index, subject: d.subject });
    case "index.transfer":
      return t("gave “{index}” from {from} to {to}", { index: d.index, from: d.from, to: d.to });
    case "index.delete":
      return t("deleted the index “{index}”", { index: d.index });
    case "document.delete":
      return t("deleted {filename} from “{index}”", { filename: d.filename, index: d.index });
    case "group.create":
      return t("created the group {name}", { name: d.name });
    case "group.rename":
      return t("renamed the group {from} to {to}", { from: d.from, to: d.to });
    case "group.delete":
      return t("deleted the group {name}", { name: d.name });
    case "group.member_add":
      return t("added {username} to {name}", { username: d.username, name: d.name });
    case "group.member_remove":
      return t("removed {username} from {name}", { username: d.username, name: d.name });
    case "user.create":
      return t("account {username} created", { username: d.username });
    case "auth.login_throttled":
      return t("failed sign-in as {username} (slowed down)", { username: d.username });
    default:
      return `${event.object_type} ${event.object_id}`.trim();
  }
}

function renderAudit(root) {
  const rows = h("tbody", {});
  const more = h("button", { class: "button ghost", type: "button", hidden: true, text: t("Older events") });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const action = h(
    "select",
    { class: "input", id: "audit-action", "aria-label": t("Which events") },
    ACTIONS.map(([value, text]) => h("option", { value, text })),
  );
  let before = null;

  const load = async (reset) => {
    error.hidden = true;
    if (reset) {
      before = null;
      rows.replaceChildren();
    }
    let page;
    try {
      page = await api.listAudit({ action: action.value, before, limit: 50 });
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      return;
    }
    for (const event of page.events) {
      rows.append(
        h(
          "tr",
          { class: "audit-row", dataset: { action: event.action } },
          h("td", { class: "muted", title: event.at || "", text: relativeTime(event.at) }),
          h("td", { text: event.actor_name || "—" }),
          h("td", {}, h("code", { text: event.action })),
          h("td", { class: "audit-what", text: describe(event) }),
          h("td", { class: "muted hide-narrow", text: event.address || "" }),
        ),
      );
    }
    if (!rows.children.length) rows.append(h("tr", {}, h("td", { colspan: 5, class: "muted", text: t("Nothing recorded yet.") })));
    before = page.next_before;
    more.hidden = !before;
  };
  action.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));

  mount(
    root,
    h("div", { class: "audit-filters" }, h("label", { class: "field inline", for: "audit-action" }, h("span", { text: t("Show") }), action)),
    error,
    h(
      "div",
      { class: "doc-table-wrap" },
      h(
        "table",
        { class: "doc-table audit-table" },
        h("caption", { class: "visually-hidden", text: t("Audit log, newest first") }),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            h("th", { scope: "col", text: t("When") }),
            h("th", { scope: "col", text: t("Who") }),
            h("th", { scope: "col", text: t("Event") }),
            h("th", { scope: "col", text: t("What") }),
            h("th", { scope: "col", class: "hide-narrow", text: t("From") }),
          ),
        ),
        rows,
      ),
    ),
    more,
    h("p", { class: "hint muted", text: t("The log is append-only: nobody can change or remove an event through the API.") }),
  );
  load(true);
}

registerAdminTab({ id: "groups", label: t("Groups"), render: renderGroups });
registerAdminTab({ id: "audit", label: t("Audit log"), render: renderAudit });

/** The sidebar's link to the Admin area, for administrators. */
export function adminLink(navLink) {
  return session.user?.is_admin ? navLink("admin", t("Admin"), "shield") : null;
}
