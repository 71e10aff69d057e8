// Thumbs up / down under a stored answer, with an optional reason and comment (gateway/feedback.py). The user
// may change a rating or take it back (pressing the chosen thumb again).

import { api } from "../api.js";
import { h, icon } from "../dom.js";
import { t } from "../i18n.js";

export const REASONS = {
  wrong: t("Wrong"),
  not_in_sources: t("Not in the sources"),
  incomplete: t("Incomplete"),
  bad_citation: t("Bad citation"),
};

/** Fills `turn.feedbackSlot` for the stored answer `turn.messageId` of chat `chatId`; `current` its rating. */
export function attachFeedback(turn, chatId, current = null) {
  if (!turn.messageId || !turn.feedbackSlot || turn.state !== "done") return;
  const slot = turn.feedbackSlot;
  let rating = current;
  const status = h("span", { class: "feedback-status muted", role: "status" });
  // Drawn thumbs, not emoji: a machine without an emoji font showed two empty boxes.
  const up = h("button", { class: "button ghost feedback-up", type: "button", "aria-label": t("Good answer"), title: t("Good answer") }, icon("thumbsUp"));
  const down = h("button", { class: "button ghost feedback-down", type: "button", "aria-label": t("Bad answer"), title: t("Bad answer") }, icon("thumbsDown"));
  const reason = h(
    "select",
    { class: "feedback-reason", "aria-label": t("What was wrong") },
    h("option", { value: "", text: t("Reason (optional)") }),
    ...Object.entries(REASONS).map(([value, text]) => h("option", { value, text })),
  );
  const comment = h("textarea", { class: "feedback-comment", rows: 2, maxlength: 2000, "aria-label": t("Comment (optional)"), placeholder: t("What should it have said? (optional)") });
  const save = h("button", { class: "button primary feedback-save", type: "button", text: t("Send feedback") });
  const form = h("div", { class: "feedback-form", hidden: true }, reason, comment, save);

  const show = () => {
    up.setAttribute("aria-pressed", String(rating?.rating === "up"));
    down.setAttribute("aria-pressed", String(rating?.rating === "down"));
    slot.dataset.rating = rating?.rating || "";
  };
  const submit = async (fields) => {
    status.textContent = t("Saving…");
    try {
      rating = await api.rateMessage(chatId, turn.messageId, fields);
      status.textContent = t("Thanks, your feedback is saved.");
      form.hidden = true;
    } catch (err) {
      status.textContent = err.message;
    }
    show();
  };
  up.addEventListener("click", async () => {
    if (rating?.rating === "up") {
      try {
        await api.unrateMessage(chatId, turn.messageId);
        rating = null;
        status.textContent = t("Rating removed.");
      } catch (err) {
        status.textContent = err.message;
      }
      show();
      return;
    }
    await submit({ rating: "up", comment: comment.value.trim() || null });
  });
  down.addEventListener("click", () => {
    form.hidden = !form.hidden;
    reason.value = rating?.reason || "";
    comment.value = rating?.comment || "";
    if (!form.hidden) reason.focus();
  });
  save.addEventListener("click", () =>
    submit({ rating: "down", reason: reason.value || null, comment: comment.value.trim() || null }),
  );
  slot.replaceChildren(h("div", { class: "feedback-bar" }, h("span", { class: "muted", text: t("Was this helpful?") }), up, down, status), form);
  show();
}
