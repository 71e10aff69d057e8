// The sidebar's chat list: newest first, rename and delete in place.

import { api } from "../api.js";
import { confirmDialog, promptDialog } from "../dialogs.js";
import { announce, h, icon, mount, relativeTime } from "../dom.js";
import { navigate } from "../router.js";
import { t } from "../i18n.js";

export const UNTITLED = t("New chat");

export class ChatList {
  constructor({ onOpen }) {
    this.onOpen = onOpen;
    this.activeId = null;
    this.chats = [];
    this.list = h("ul", { class: "chat-list", role: "list" });
    this.element = h(
      "nav",
      { class: "chat-nav", "aria-label": t("Chats") },
      h("h2", { class: "sidebar-label", text: t("Chats") }),
      this.list,
    );
  }

  async refresh() {
    try {
      this.chats = await api.listChats();
    } catch {
      return; // a 401 already moved to login; otherwise keep the list we had
    }
    // Newest first even if the server's order changes.
    this.chats.sort((a, b) => String(b.updated_at || "").localeCompare(String(a.updated_at || "")));
    this.render();
  }

  /** The chat as last listed, or undefined. */
  get(id) {
    return this.chats.find((chat) => String(chat.id) === String(id));
  }

  setActive(id) {
    this.activeId = id === null || id === undefined ? null : String(id);
    for (const item of this.list.querySelectorAll("[data-chat-id]")) {
      const link = item.querySelector(".chat-link");
      if (item.dataset.chatId === this.activeId) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  render() {
    if (!this.chats.length) {
      mount(this.list, h("li", { class: "chat-empty muted", text: t("No chats yet") }));
      return;
    }
    mount(this.list, this.chats.map((chat) => this.renderItem(chat)));
    this.setActive(this.activeId);
  }

  renderItem(chat) {
    const title = chat.title || UNTITLED;
    return h(
      "li",
      { class: "chat-item", dataset: { chatId: String(chat.id) } },
      h(
        "a",
        { class: "chat-link", href: `#/chats/${encodeURIComponent(chat.id)}` },
        h("span", { class: "chat-title", text: title }),
        h("span", { class: "chat-time", text: relativeTime(chat.updated_at) }),
      ),
      h(
        "div",
        { class: "chat-actions" },
        h(
          "button",
          { class: "icon-button small", type: "button", "aria-label": t("Rename “{title}”", { title }), title: t("Rename"), onclick: () => this.rename(chat) },
          icon("edit"),
        ),
        h(
          "button",
          { class: "icon-button small", type: "button", "aria-label": t("Delete “{title}”", { title }), title: t("Delete"), onclick: () => this.remove(chat) },
          icon("trash"),
        ),
      ),
    );
  }

  async rename(chat) {
    const title = await promptDialog({ title: t("Rename chat"), label: t("Title"), value: chat.title || "" });
    if (!title || title === chat.title) return;
    try {
      await api.updateChat(chat.id, { title });
      announce(t("Chat renamed to {title}", { title }));
    } catch (err) {
      announce(t("Could not rename: {message}", { message: err.message }));
    }
    await this.refresh();
    document.dispatchEvent(new CustomEvent("chat-changed", { detail: { id: chat.id } }));
  }

  async remove(chat) {
    const ok = await confirmDialog({
      title: t("Delete this chat?"),
      message: t("“{title}” and its messages will be deleted for good.", { title: chat.title || UNTITLED }),
      confirm: t("Delete"),
      danger: true,
    });
    if (!ok) return;
    try {
      await api.deleteChat(chat.id);
      announce(t("Chat deleted"));
    } catch (err) {
      announce(t("Could not delete: {message}", { message: err.message }));
    }
    await this.refresh();
    if (String(chat.id) === this.activeId) navigate("#/chats");
  }
}
