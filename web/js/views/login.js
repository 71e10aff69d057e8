// Sign in / create account. The first account on a fresh gateway becomes its admin.

import { ApiError, api, session } from "../api.js";
import { h } from "../dom.js";

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
  const submit = h("button", { class: "button primary block", type: "submit", text: "Sign in" });
  const heading = h("h1", { id: "login-title", text: "Welcome back" });
  const subtitle = h("p", { class: "muted", text: "Sign in to chat with your documents." });
  const switchLink = h("button", { class: "link-button", type: "button" });
  const switchText = h("span", { class: "muted" });

  const setMode = (next) => {
    mode = next;
    const registering = mode === "register";
    heading.textContent = registering ? "Create your account" : "Welcome back";
    subtitle.textContent = registering
      ? "Your documents and chats stay on this server."
      : "Sign in to chat with your documents.";
    submit.textContent = registering ? "Create account" : "Sign in";
    password.autocomplete = registering ? "new-password" : "current-password";
    switchText.textContent = registering ? "Already have an account? " : "New here? ";
    switchLink.textContent = registering ? "Sign in" : "Create an account";
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
            err instanceof ApiError ? err.message : "Something went wrong. Please try again.";
          error.hidden = false;
          (err.field === "password" ? password : username).focus();
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("div", { class: "brand large" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "◆" }), "RAG Chat"),
    heading,
    subtitle,
    notice ? h("p", { class: "notice", role: "status", text: notice }) : null,
    h("label", { class: "field", for: "login-username" }, h("span", { text: "Username" }), username),
    h("label", { class: "field", for: "login-password" }, h("span", { text: "Password" }), password),
    error,
    submit,
    h("p", { class: "switch-mode" }, switchText, switchLink),
  );
  queueMicrotask(() => username.focus());
  return h("div", { class: "login-page" }, h("main", { id: "main", class: "login-main" }, form));
}
