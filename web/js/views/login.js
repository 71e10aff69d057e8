// Sign in / create account. The first account on a fresh gateway becomes its admin.

import { ApiError, api, session } from "../api.js";
import { h } from "../dom.js";
import { t } from "../i18n.js";

export function renderLogin({ notice = "", onSignedIn }) {
  let mode = "login";
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const username = h("input", {
    class: "input",
    id: "login-username",
    name: "username",
    autocomplete: "username",
    required: true,
    autocapitalize: "none",
    spellcheck: false,
  });
  const password = h("input", {
    class: "input",
    id: "login-password",
    name: "password",
    type: "password",
    autocomplete: "current-password",
    required: true,
  });
  const submit = h("button", { class: "button primary block", type: "submit", text: t("Sign in") });
  const heading = h("h1", { id: "login-title", text: t("Welcome back") });
  const subtitle = h("p", { class: "muted", text: t("Sign in to chat with your documents.") });
  const switchLink = h("button", { class: "link-button", type: "button" });
  const switchText = h("span", { class: "muted" });

  const setMode = (next) => {
    mode = next;
    const registering = mode === "register";
    heading.textContent = registering ? t("Create your account") : t("Welcome back");
    subtitle.textContent = registering
      ? t("Your documents and chats stay on this server.")
      : t("Sign in to chat with your documents.");
    submit.textContent = registering ? t("Create account") : t("Sign in");
    password.autocomplete = registering ? "new-password" : "current-password";
    switchText.textContent = registering ? t("Already have an account? ") : t("New here? ");
    switchLink.textContent = registering ? t("Sign in") : t("Create an account");
    error.hidden = true;
  };
  switchLink.addEventListener("click", () => setMode(mode === "login" ? "register" : "login"));
  setMode("login");

  const form = h(
    "form",
    {
      class: "login-card",
      "aria-labelledby": "login-title",
      onsubmit: async (event) => {
        event.preventDefault();
        error.hidden = true;
        submit.disabled = true;
        try {
          const call = mode === "register" ? api.register : api.login;
          const answer = await call(username.value.trim(), password.value);
          session.setUser(answer.user); // the token itself arrived as an HttpOnly cookie
          onSignedIn(answer.user);
        } catch (err) {
          error.textContent =
            err instanceof ApiError ? err.message : t("Something went wrong. Please try again.");
          error.hidden = false;
          (err.field === "password" ? password : username).focus();
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("div", { class: "brand large" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "◆" }), t("RAG Chat")),
    heading,
    subtitle,
    notice ? h("p", { class: "notice", role: "status", text: notice }) : null,
    h("label", { class: "field", for: "login-username" }, h("span", { text: t("Username") }), username),
    h("label", { class: "field", for: "login-password" }, h("span", { text: t("Password") }), password),
    error,
    submit,
    h("p", { class: "switch-mode" }, switchText, switchLink),
  );
  queueMicrotask(() => username.focus());
  return h("div", { class: "login-page" }, h("main", { id: "main", class: "login-main" }, form));
}
