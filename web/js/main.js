// Entry point: the session check, the hash router and the app shell (sidebar + main view).

import { api, session, setUnauthorizedHandler } from "./api.js";
import { h, icon, mount } from "./dom.js";
import { navigate, onRoute, parseRoute } from "./router.js";
import { currentTheme, toggleTheme } from "./theme.js";
import { AdminView, adminLink } from "./views/admin.js";
import { ChatList } from "./views/chatlist.js";
import { ChatView } from "./views/chat.js";
import "./views/admin_users.js"; // its "Users" tab in the Admin area
import { DocumentsView } from "./views/documents.js";
import { KeysView } from "./views/keys.js";
import { RatingsView } from "./views/ratings.js"; // also its "Ratings" tab in the Admin area
import { renderLogin } from "./views/login.js";
import { SettingsView } from "./views/settings.js";
import "./views/turnstats.js"; // its "Statistics" tab in the Admin area

const app = document.getElementById("app");
import { t } from "./i18n.js";
let shell = null;
let currentView = null;
let loginNotice = "";

setUnauthorizedHandler(() => {
  loginNotice = t("Your session has ended. Please sign in again.");
  currentView?.destroy?.();
  currentView = null;
  shell = null;
  navigate("#/login");
});

function route() {
  const { name, id } = parseRoute();
  if (!session.user) {
    if (name !== "login") {
      navigate("#/login");
      return;
    }
    showLogin();
    return;
  }
  if (name === "login") {
    navigate("#/chats");
    return;
  }
  ensureShell();
  currentView?.destroy?.();
  currentView = null;
  shell.closeSidebar();
  if (name === "documents") currentView = new DocumentsView(shell, id);
  else if (name === "settings") currentView = new SettingsView(shell);
  else if (name === "keys") currentView = new KeysView(shell);
  else if (name === "admin") currentView = new AdminView(shell, id);
  else if (name === "ratings") currentView = new RatingsView(shell, id);
  else currentView = new ChatView(shell, id);
  shell.chatList.setActive(name === "chats" ? id : null);
  shell.setActiveNav(name);
  mount(shell.main, currentView.element);
  currentView.start?.();
}

function showLogin() {
  currentView?.destroy?.();
  currentView = null;
  shell = null;
  document.title = t("Sign in · RAG Chat");
  const notice = loginNotice;
  loginNotice = "";
  mount(
    app,
    renderLogin({
      notice,
      onSignedIn: (user) => {
        session.setUser(user);
        navigate("#/chats");
      },
    }),
  );
}

function themeButton() {
  const button = h("button", {
    class: "icon-button",
    type: "button",
    onclick: () => {
      toggleTheme();
      update();
    },
  });
  const update = () => {
    const dark = currentTheme() === "dark";
    button.replaceChildren(icon(dark ? "sun" : "moon"));
    button.setAttribute("aria-label", dark ? t("Switch to light theme") : t("Switch to dark theme"));
    button.title = button.getAttribute("aria-label");
  };
  update();
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", update);
  return button;
}

function ensureShell() {
  if (shell) return;
  const user = session.user || {};
  const chatList = new ChatList({ onOpen: (id) => navigate(`#/chats/${encodeURIComponent(id)}`) });
  const main = h("main", { id: "main", class: "main", tabindex: "-1" });
  const sidebar = h("aside", { class: "sidebar", id: "sidebar", "aria-label": t("Chats and navigation") });
  const scrim = h("div", { class: "scrim", onclick: () => shellApi.closeSidebar() });
  const navLink = (name, label, iconName) =>
    h("a", { class: "nav-link", href: `#/${name}`, dataset: { nav: name } }, icon(iconName), h("span", { text: label }));

  mount(
    sidebar,
    h(
      "div",
      { class: "sidebar-head" },
      h("a", { class: "brand", href: "#/chats" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "◆" }), t("RAG Chat")),
      h(
        "button",
        { class: "icon-button only-narrow", type: "button", "aria-label": t("Close menu"), onclick: () => shellApi.closeSidebar() },
        icon("close"),
      ),
    ),
    h(
      "a",
      {
        class: "button primary new-chat",
        href: "#/chats",
        onclick: (event) => {
          event.preventDefault();
          navigate("#/chats");
        },
      },
      icon("plus"),
      h("span", { text: t("New chat") }),
    ),
    chatList.element,
    h(
      "nav",
      { class: "sidebar-nav", "aria-label": t("Sections") },
      navLink("documents", t("Documents"), "files"),
      navLink("keys", t("API keys"), "key"),
      navLink("settings", t("Settings"), "settings"),
      adminLink(navLink),
    ),
    h(
      "div",
      { class: "sidebar-foot" },
      h("span", { class: "avatar", "aria-hidden": "true", text: (user.username || "?").slice(0, 1).toUpperCase() }),
      h("span", { class: "user-name", text: user.username || "" }),
      themeButton(),
      h(
        "button",
        {
          class: "icon-button",
          type: "button",
          "aria-label": t("Sign out"),
          title: t("Sign out"),
          onclick: async () => {
            try {
              await api.logout();
            } catch {
              // Offline: the cookie stays until it expires, but this tab forgets the user.
            }
            session.clear();
            navigate("#/login");
          },
        },
        icon("logout"),
      ),
    ),
  );
  mount(app, h("div", { class: "shell" }, sidebar, scrim, main));

  const shellApi = {
    main,
    chatList,
    openSidebar() {
      sidebar.classList.add("open");
      scrim.classList.add("open");
      sidebar.querySelector("a, button")?.focus();
    },
    closeSidebar() {
      sidebar.classList.remove("open");
      scrim.classList.remove("open");
    },
    setActiveNav(name) {
      for (const link of sidebar.querySelectorAll("[data-nav]")) {
        if (link.dataset.nav === name) link.setAttribute("aria-current", "page");
        else link.removeAttribute("aria-current");
      }
    },
    /** The top bar each view shows: the menu button on phones, a title, and the view's own actions. */
    header(title, ...actions) {
      return h(
        "header",
        { class: "topbar" },
        h(
          "button",
          { class: "icon-button only-narrow", type: "button", "aria-label": t("Open menu"), "aria-controls": "sidebar", onclick: () => shellApi.openSidebar() },
          icon("menu"),
        ),
        title,
        h("div", { class: "topbar-actions" }, ...actions),
      );
    },
  };
  sidebar.addEventListener("keydown", (event) => {
    if (event.key === "Escape") shellApi.closeSidebar();
  });
  shell = shellApi;
  chatList.refresh();
}

// The skip link focuses the main region without changing the hash (which is the route).
document.addEventListener("click", (event) => {
  const skip = event.target.closest?.(".skip-link");
  if (!skip) return;
  event.preventDefault();
  document.getElementById("main")?.focus();
});

async function start() {
  // index.html's own texts, in the interface's language (i18n.js has set <html lang> already).
  const skip = document.querySelector(".skip-link");
  if (skip) skip.textContent = t("Skip to content");
  onRoute(route);
  try {
    // Signed in when the browser holds a valid session cookie (from this tab or another).
    session.setUser((await api.currentSession())?.user || null);
  } catch {
    // A network error: the login page says so on the next try.
  }
  route();
}

start();
