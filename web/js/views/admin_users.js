// The Admin area's Users tab (administrators only; for anyone else the gateway's /api/users routes do not exist, a 404): every
// account with its role and state; disable / enable (disabling signs it out everywhere and stops its API keys),
// make or unmake an administrator (never oneself), and set a new password for someone who lost theirs (their
// sessions end; they sign in with the new one).

import { api, session } from "../api.js";
import { confirmDialog, customDialog } from "../dialogs.js";
import { announce, h, mount, relativeTime } from "../dom.js";
import { registerAdminTab } from "./admin.js";

function passwordDialog(username) {
  return new Promise((resolve) => {
    let value = null;
    customDialog(`New password for ${username}`, (close) => {
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
        h("p", { class: "muted", text: "Their sessions end; tell them the new password so they can sign in. Their API keys go on working." }),
        h("label", { class: "field", for: "reset-password" }, h("span", { text: "New password (at least 8 characters)" }), input),
        h(
          "div",
          { class: "modal-actions" },
          h("button", { class: "button ghost", value: "cancel", formnovalidate: true, text: "Cancel", onclick: () => close("cancel") }),
          h("button", { class: "button primary", value: "ok", text: "Set password" }),
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
    this.body = h("div", { class: "users-body" }, h("p", { class: "muted", text: "Loading…" }));
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
      if (err.status === 404) mount(this.body, h("p", { class: "muted", text: "Only administrators manage users." }));
      else if (err.status !== 401) mount(this.body, h("p", { class: "form-error", role: "alert", text: err.message }));
      return;
    }
    const rows = users.map((user) => {
      const self = user.id === session.user?.id;
      const actions = self
        ? [h("span", { class: "muted", text: "you" })]
        : [
            h("button", {
              class: `button small${user.disabled ? "" : " danger"}`,
              type: "button",
              text: user.disabled ? "Enable" : "Disable",
              "aria-label": `${user.disabled ? "Enable" : "Disable"} ${user.username}`,
              onclick: async () => {
                if (
                  !user.disabled &&
                  !(await confirmDialog({
                    title: `Disable ${user.username}?`,
                    message: "They are signed out everywhere, their API keys stop working, and they cannot sign in until enabled again.",
                    confirm: "Disable",
                    danger: true,
                  }))
                )
                  return;
                this.act(() => api.updateUser(user.id, { disabled: !user.disabled }), `${user.username} ${user.disabled ? "enabled" : "disabled"}`);
              },
            }),
            h("button", {
              class: "button small",
              type: "button",
              text: user.is_admin ? "Remove admin" : "Make admin",
              "aria-label": `${user.is_admin ? "Remove admin from" : "Make admin"} ${user.username}`,
              onclick: async () => {
                const sure = await confirmDialog({
                  title: user.is_admin ? `Remove administrator rights from ${user.username}?` : `Make ${user.username} an administrator?`,
                  message: user.is_admin
                    ? "They keep their account, chats and indexes; the administration is gone for them at once."
                    : "They can then manage users, settings and every account's access.",
                  confirm: user.is_admin ? "Remove admin" : "Make admin",
                  danger: user.is_admin,
                });
                if (!sure) return;
                this.act(() => api.updateUser(user.id, { is_admin: !user.is_admin }), `${user.username} is ${user.is_admin ? "no longer" : "now"} an administrator`);
              },
            }),
            h("button", {
              class: "button small ghost",
              type: "button",
              text: "Reset password",
              "aria-label": `Reset the password of ${user.username}`,
              onclick: async () => {
                const password = await passwordDialog(user.username);
                if (password) this.act(() => api.resetPassword(user.id, password), `A new password is set for ${user.username}`);
              },
            }),
          ];
      return h(
        "tr",
        { dataset: { username: user.username } },
        h("td", { text: user.username }),
        h("td", { class: "account-role", text: user.is_admin ? "admin" : "user" }),
        h("td", { class: "account-state", text: user.disabled ? "disabled" : "active" }),
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
          h("thead", {}, h("tr", {}, ["Name", "Role", "State", "Created", ""].map((t) => h("th", { text: t })))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }
}

registerAdminTab({ id: "users", label: "Users", render: renderUsers });
