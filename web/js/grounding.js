// The worker's grounding check on an answer (`answer.grounding`, live and stored alike): a badge
// ("grounded 4/5 sentences", or "quoted from the sources"), a banner when unsupported sentences were kept, and
// the unsupported sentences themselves marked inside the rendered answer.

import { h } from "./dom.js";
import { t } from "./i18n.js";

const CITATION = /\[S\d+(?:\s*[,;]\s*S\d+)*\]/g;
const WORD_CHAR = /[\p{L}\p{N}]/u;

/** The badge for the message's meta line, or null when the answer had no sources to check against. */
export function groundingBadge(grounding) {
  if (!grounding || typeof grounding.checked !== "number") return null;
  if (grounding.answer_mode === "extractive") {
    return h("span", {
      class: "grounding-badge quoted",
      text: t("quoted from the sources"),
      title: t("An extractive answer: sentences quoted from the sources, not written by the model"),
    });
  }
  if (grounding.action === "refused") {
    const d = grounding.draft || grounding;
    return h("span", {
      class: "grounding-badge refused",
      text: t("draft withheld: grounded {supported}/{checked} sentences", { supported: d.supported, checked: d.checked }),
    });
  }
  const all = grounding.supported === grounding.checked;
  return h("span", {
    class: `grounding-badge ${all ? "grounded" : "partly"}`,
    text: t("grounded {supported}/{checked} sentences", { supported: grounding.supported, checked: grounding.checked }),
    title: t("Sentences of the answer backed by the passages the model read"),
  });
}

/** A banner when the answer keeps sentences the sources do not support (policy `flag`). */
export function groundingBanner(grounding) {
  const unsupported = unsupportedSentences(grounding);
  if (grounding?.answer_mode === "extractive" || !unsupported.length) return null;
  const n = unsupported.length;
  return t("{count} sentences are not supported by the sources and are marked.", { count: n });
}

function unsupportedSentences(grounding) {
  if (!grounding || !Array.isArray(grounding.sentences) || grounding.action === "refused") return [];
  return grounding.sentences.filter((s) => s && s.label === "unsupported" && typeof s.text === "string");
}

/**
 * Wraps each unsupported sentence's text inside `root` (rendered markdown, before citations become links) in
 * <mark class="ungrounded">. Matching ignores markup, punctuation and [S1] citations, so `code` and **bold**
 * inside a sentence do not get in the way; a sentence that cannot be found is simply left unmarked.
 */
export function markUnsupported(root, grounding) {
  const needles = unsupportedSentences(grounding)
    .map((s) => normalise(s.text.replace(CITATION, "")))
    .filter((n) => n.length >= 8);
  if (!needles.length) return;
  const { text, map } = indexText(root);
  const segments = [];
  let from = 0;
  for (const needle of needles) {
    const at = text.indexOf(needle, from);
    if (at < 0) continue;
    from = at + needle.length;
    // Group the matched characters by text node: one segment [start, end) per node.
    let current = null;
    for (let i = at; i < at + needle.length; i++) {
      const [node, offset] = map[i];
      if (current && current.node === node) current.end = offset + 1;
      else segments.push((current = { node, start: offset, end: offset + 1 }));
    }
  }
  // From the last to the first: wrapping splits a node after the segment, so earlier offsets stay valid.
  for (const seg of segments.reverse()) {
    const range = document.createRange();
    range.setStart(seg.node, seg.start);
    range.setEnd(seg.node, seg.end);
    range.surroundContents(h("mark", { class: "ungrounded", title: t("Not supported by the sources") }));
  }
}

function normalise(text) {
  let out = "";
  for (const ch of text.toLowerCase()) if (WORD_CHAR.test(ch)) out += ch;
  return out;
}

/** The root's word characters (lowercased, citations left out), each mapped back to [textNode, offset]. */
function indexText(root) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  let text = "";
  const map = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const value = node.nodeValue;
    const skip = new Set();
    for (const m of value.matchAll(CITATION)) for (let i = m.index; i < m.index + m[0].length; i++) skip.add(i);
    for (let i = 0; i < value.length; i++) {
      if (skip.has(i) || !WORD_CHAR.test(value[i])) continue;
      text += value[i].toLowerCase();
      map.push([node, i]);
    }
  }
  return { text, map };
}
