// The Admin area (administrators only): one page with tabs, `#/admin/<tab>`. Built-in tabs: Groups (create,
// rename, delete, members) and Audit log (filters, paging). Other modules add theirs with registerAdminTab
// (e.g. users, API keys) before the page is opened; tabs appear in the order registered.

import { api, session } from "../api.js";
import { confirmDialog, promptDialog } from "../dialogs.js";
import { announce, h, icon, mount, relativeTime } from "../dom.js";
import { replaceRoute } from "../router.js";

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
    this.tabBar = h("div", { class: "tabs", role: "tablist", "aria-label": "Admin sections" });
    this.panel = h("div", { class: "tab-panel", role: "tabpanel", tabindex: "-1" });
    this.element = h(
      "section",
      { class: "page admin-view", "aria-labelledby": "admin-title" },
      shell.header(h("h1", { class: "topbar-title", id: "admin-title", text: "Admin" })),
      h("div", { class: "page-body" }, this.tabBar, this.panel),
    );
    this.cleanup = null;
  }

  start() {
    document.title = "Admin · RAG Chat";
    if (!session.user?.is_admin) {
      mount(this.panel, h("p", { class: "muted", text: "Only administrators can open this page." }));
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
  const name = h("input", { class: "input", id: "new-group-name", required: true, maxlength: 64, placeholder: "e.g. support", autocomplete: "off" });

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
      groups.length ? groups.map((group) => groupCard(group)) : h("p", { class: "muted", text: "No groups yet. A group can be given access to indexes in one share." }),
    );
  };

  const groupCard = (group) => {
    const member = h("input", { class: "input small", placeholder: "username", autocomplete: "off", "aria-label": `Add a member to ${group.name}` });
    return h(
      "div",
      { class: "card group-card", dataset: { group: group.name } },
      h(
        "div",
        { class: "group-head" },
        h("h3", { class: "group-name", text: group.name }),
        h("span", { class: "muted small", text: `${group.members.length} member${group.members.length === 1 ? "" : "s"}` }),
        h(
          "button",
          {
            class: "icon-button small",
            type: "button",
            "aria-label": `Rename ${group.name}`,
            title: "Rename",
            onclick: async () => {
              const value = await promptDialog({ title: `Rename ${group.name}`, label: "Name", value: group.name });
              if (!value || value === group.name) return;
              try {
                await api.updateGroup(group.id, { name: value });
                announce(`Renamed to ${value}`);
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
            "aria-label": `Delete ${group.name}`,
            title: "Delete",
            onclick: async () => {
              const ok = await confirmDialog({
                title: `Delete the group “${group.name}”?`,
                message: "Its members lose what was shared with the group (their own shares stay).",
                confirm: "Delete group",
                danger: true,
              });
              if (!ok) return;
              try {
                await api.deleteGroup(group.id);
                announce(`Group ${group.name} deleted`);
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
        { class: "member-list", role: "list", "aria-label": `Members of ${group.name}` },
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
                "aria-label": `Remove ${m.username} from ${group.name}`,
                title: "Remove",
                onclick: async () => {
                  try {
                    await api.removeMember(group.id, m.id);
                    announce(`${m.username} removed from ${group.name}`);
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
              announce(`${member.value.trim()} added to ${group.name}`);
            } catch (err) {
              fail(err);
              return;
            }
            await refresh();
          },
        },
        member,
        h("button", { class: "button small", type: "submit", text: "Add member" }),
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
            announce(`Group ${group.name} created`);
          } catch (err) {
            fail(err);
            return;
          }
          await refresh();
        },
      },
      h("label", { class: "field inline", for: "new-group-name" }, h("span", { text: "New group" }), name),
      h("button", { class: "button primary", type: "submit" }, icon("plus"), h("span", { text: "Create group" })),
    ),
    error,
    list,
  );
  refresh();
}

// ---- Audit log ---------------------------------------------------------------------------------------------------

const ACTIONS = [
  ["", "Every event"],
  ["index.", "Indexes: shares, transfers, deletions"],
  ["document.", "Documents deleted"],
  ["group.", "Groups"],
  ["user.", "Accounts"],
  ["auth.", "Sign-in failures"],
  ["key.", "API keys"],
  ["settings.", "Settings"],
];

function describe(event) {
  const d = event.detail || {};
  switch (event.action) {
    case "index.grant":
      return `shared “${d.index}” with ${d.subject} as ${d.role}${d.was ? ` (was ${d.was})` : ""}`;
    case "index.revoke":
      return `stopped sharing “${d.index}” with ${d.subject}`;
    case "index.transfer":
      return `gave “${d.index}” from ${d.from} to ${d.to}`;
    case "index.delete":
      return `deleted the index “${d.index}”`;
    case "document.delete":
      return `deleted ${d.filename} from “${d.index}”`;
    case "group.create":
      return `created the group ${d.name}`;
    case "group.rename":
      return `renamed the group ${d.from} to ${d.to}`;
    case "group.delete":
      return `deleted the group ${d.name}`;
    case "group.member_add":
      return `added ${d.username} to ${d.name}`;
    case "group.member_remove":
      return `removed ${d.username} from ${d.name}`;
    case "user.create":
      return `account ${d.username} created`;
    case "auth.login_throttled":
      return `failed sign-in as ${d.username} (slowed down)`;
    default:
      return `${event.object_type} ${event.object_id}`.trim();
  }
}

function renderAudit(root) {
  const rows = h("tbody", {});
  const more = h("button", { class: "button ghost", type: "button", hidden: true, text: "Older events" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const action = h(
    "select",
    { class: "input", id: "audit-action", "aria-label": "Which events" },
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
    if (!rows.children.length) rows.append(h("tr", {}, h("td", { colspan: 5, class: "muted", text: "Nothing recorded yet." })));
    before = page.next_before;
    more.hidden = !before;
  };
  action.addEventListener("change", () => load(true));
  more.addEventListener("click", () => load(false));

  mount(
    root,
    h("div", { class: "audit-filters" }, h("label", { class: "field inline", for: "audit-action" }, h("span", { text: "Show" }), action)),
    error,
    h(
      "div",
      { class: "doc-table-wrap" },
      h(
        "table",
        { class: "doc-table audit-table" },
        h("caption", { class: "visually-hidden", text: "Audit log, newest first" }),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            h("th", { scope: "col", text: "When" }),
            h("th", { scope: "col", text: "Who" }),
            h("th", { scope: "col", text: "Event" }),
            h("th", { scope: "col", text: "What" }),
            h("th", { scope: "col", class: "hide-narrow", text: "From" }),
          ),
        ),
        rows,
      ),
    ),
    more,
    h("p", { class: "hint muted", text: "The log is append-only: nobody can change or remove an event through the API." }),
  );
  load(true);
}

registerAdminTab({ id: "groups", label: "Groups", render: renderGroups });
registerAdminTab({ id: "audit", label: "Audit log", render: renderAudit });

/** The sidebar's link to the Admin area, for administrators. */
export function adminLink(navLink) {
  return session.user?.is_admin ? navLink("admin", "Admin", "shield") : null;
}
