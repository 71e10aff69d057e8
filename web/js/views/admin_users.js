// The Admin area's Users tab (administrators only; for anyone else the gateway's /api/users routes do not exist, a 404): every
// account with its role and state; disable / enable (disabling signs it out everywhere and stops its API keys),
// make or unmake an administrator (never oneself), and set a new password for someone who lost theirs (their
// sessions end; they sign in with the new one).

import { api, session } from "../api.js";
import { confirmDialog, customDialog } from "../dialogs.js";
import { announce, h, mount, relativeTime } from "../dom.js";
import { registerAdminTab } from "./admin.js";
import { t } from "../i18n.js";

function passwordDialog(username) {
  return new Promise((resolve) => {
    let value = null;
    customDialog(t("New password for {username}", { username }), (close) => {
      const input = h("input", { class: "input", id: "reset-password", type: "password", minlength: 8, maxlength: 1024, required: true, autocomplete: "new-password" });
      queueMicrotask(() => input.focus());
      return h(
        "form",
        {
          method: "dialog",
          onsubmit: (event) => {
            if (event.submitter?.value !== "ok") return;
            if (!input.checkValidity()) {
              event.preventDefault();
              input.reportValidity();
              return;
            }
            value = input.value;
          },
        },
        h("p", { class: "muted", text: t("Their sessions end; tell them the new password so they can sign in. Their API keys go on working.") }),
        h("label", { class: "field", for: "reset-password" }, h("span", { text: t("New password (at least 8 characters)") }), input),
        h(
          "div",
          { class: "modal-actions" },
          h("button", { class: "button ghost", value: "cancel", formnovalidate: true, text: t("Cancel"), onclick: () => close("cancel") }),
          h("button", { class: "button primary", value: "ok", text: t("Set password") }),
        ),
      );
    }).then(() => resolve(value));
  });
}

/** The users panel, filling `root` (the Admin area's "Users" tab). */
export function renderUsers(root) {
  const panel = new UsersPanel();
  mount(root, panel.element);
  panel.refresh();
}

class UsersPanel {
  constructor() {
    this.status = h("p", { class: "muted small", role: "status" });
    this.body = h("div", { class: "users-body" }, h("p", { class: "muted", text: t("Loading…") }));
    this.element = h("div", { class: "settings-body users-view" }, this.status, this.body);
  }

  async act(fn, done) {
    try {
      await fn();
      this.status.textContent = done;
      announce(done);
    } catch (err) {
      this.status.textContent = err.message;
      announce(err.message);
    }
    this.refresh();
  }

  async refresh() {
    let users;
    try {
      users = await api.listUsers();
    } catch (err) {
      if (err.status === 404) mount(this.body, h("p", { class: "muted", text: t("Only administrators manage users.") }));
      else if (err.status !== 401) mount(this.body, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    const rows = users.map((user) => {
      const self = user.id === session.user?.id;
      const actions = self
        ? [h("span", { class: "muted", text: t("you") })]
        : [
            h("button", {
              class: `button small${user.disabled ? "" : " danger"}`,
              type: "button",
              text: user.disabled ? t("Enable") : t("Disable"),
              "aria-label": `${user.disabled ? t("Enable") : t("Disable")} ${user.username}`,
              onclick: async () => {
                if (
                  !user.disabled &&
                  !(await confirmDialog({
                    title: t("Disable {username}?", { username: user.username }),
                    message: t("They are signed out everywhere, their API keys stop working, and they cannot sign in until enabled again."),
                    confirm: t("Disable"),
                    danger: true,
                  }))
                )
                  return;
                this.act(() => api.updateUser(user.id, { disabled: !user.disabled }), (user.disabled ? t("{username} enabled", { username: user.username }) : t("{username} disabled", { username: user.username })));
              },
            }),
            h("button", {
              class: "button small",
              type: "button",
              text: user.is_admin ? t("Remove admin") : t("Make admin"),
              "aria-label": user.is_admin ? t("Remove admin from {username}", { username: user.username }) : t("Make admin {username}", { username: user.username }),
              onclick: async () => {
                const sure = await confirmDialog({
                  title: user.is_admin
                    ? t("Remove administrator rights from {username}?", { username: user.username })
                    : t("Make {username} an administrator?", { username: user.username }),
                  message: user.is_admin
                    ? t("They keep their account, chats and indexes; the administration is gone for them at once.")
                    : t("They can then manage users, settings and every account's access."),
                  confirm: user.is_admin ? t("Remove admin") : t("Make admin"),
                  danger: user.is_admin,
                });
                if (!sure) return;
                this.act(() => api.updateUser(user.id, { is_admin: !user.is_admin }), (user.is_admin ? t("{username} is no longer an administrator", { username: user.username }) : t("{username} is now an administrator", { username: user.username })));
              },
            }),
            h("button", {
              class: "button small ghost",
              type: "button",
              text: t("Reset password"),
              "aria-label": t("Reset the password of {username}", { username: user.username }),
              onclick: async () => {
                const password = await passwordDialog(user.username);
                if (password) this.act(() => api.resetPassword(user.id, password), t("A new password is set for {username}", { username: user.username }));
              },
            }),
          ];
      return h(
        "tr",
        { dataset: { username: user.username } },
        h("td", { text: user.username }),
        h("td", { class: "account-role", text: user.is_admin ? t("admin") : t("user") }),
        h("td", { class: "account-state", text: user.disabled ? t("disabled") : t("active") }),
        h("td", {}, user.created_at ? h("time", { datetime: user.created_at, text: relativeTime(user.created_at) }) : ""),
        h("td", { class: "row-actions" }, actions),
      );
    });
    mount(
      this.body,
      h(
        "div",
        { class: "card doc-table-wrap" },
        h(
          "table",
          { class: "doc-table users-table" },
          h("thead", {}, h("tr", {}, [t("Name"), t("Role"), t("State"), t("Created"), ""].map((label) => h("th", { text: label })))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }
}

registerAdminTab({ id: "users", label: t("Users"), render: renderUsers });
