// Answers arrive as markdown written by a model that read user-supplied documents: treat them as hostile.
// marked renders, DOMPurify sanitises to a short allow-list, and links are kept only for web/mail schemes.

// No build step: third-party modules come straight from node_modules (npm ci --prefix web), by path (an
// import map would be an inline script, which the Content-Security-Policy forbids).
import DOMPurify from "../node_modules/dompurify/dist/purify.es.mjs";
import { marked } from "../node_modules/marked/lib/marked.esm.js";

const purifier = DOMPurify(window);

const ALLOWED_TAGS = [
  "p", "br", "hr", "strong", "em", "b", "i", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li",
  "a", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "span", "sup", "sub",
];
const ALLOWED_ATTR = ["href", "title", "start", "align", "colspan", "rowspan", "class"];
const SAFE_URL = /^(?:https?:|mailto:)/i;

// Links open in a new tab without handing it this page, and anything but http(s)/mailto loses its href
// (DOMPurify already drops javascript: URLs; this also drops relative ones that could hit the gateway's API).
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName !== "A") return;
  const href = node.getAttribute("href") || "";
  if (SAFE_URL.test(href.trim())) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  } else {
    node.removeAttribute("href");
    node.classList.add("inert-link");
  }
});

const renderer = new marked.Renderer();
// Images would load remote URLs chosen by the model (a tracking or exfiltration channel): show the alt text
// as a plain link-less label instead.
renderer.image = ({ text }) => `<span class="image-alt">[image: ${escapeHtml(text || "")}]</span>`;

// Raw HTML in an answer is shown as the text it is, not interpreted (DOMPurify remains the second wall).
renderer.html = ({ text }) => escapeHtml(text);

marked.use({ renderer, gfm: true, breaks: false, async: false });

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Markdown → a sanitised DocumentFragment. */
export function renderMarkdown(text) {
  const html = marked.parse(text || "");
  return purifier.sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
}

/**
 * A passage as one line of plain text for a source card: code fence lines dropped (a chunk of a long code block
 * carries its own fences), whitespace collapsed, cut at `max` characters with an ellipsis.
 */
export function snippet(text, max = 280) {
  const plain = (text || "")
    .replace(/^ {0,3}(?:`{3,}|~{3,}).*$/gm, " ")
    .replace(/\s+/g, " ")
    .trim();
  return plain.length > max ? `${plain.slice(0, max)}…` : plain;
}

const CITATION = /\[(S\d+(?:\s*[,;]\s*S\d+)*)\]/;

/**
 * Replaces "[S1]" and "[S1, S2]" references in text nodes (not inside code or links) with anchors built by
 * `makeLink(ref)`; refs for which it returns null stay as text.
 */
export function linkCitations(root, makeLink) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode(node) {
      return node.parentElement?.closest("code, pre, a") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT;
    },
  });
  const nodes = [];
  while (walker.nextNode()) {
    if (CITATION.test(walker.currentNode.nodeValue)) nodes.push(walker.currentNode);
  }
  const all = new RegExp(CITATION.source, "g");
  for (const node of nodes) {
    const text = node.nodeValue;
    const fragment = document.createDocumentFragment();
    let last = 0;
    for (const match of text.matchAll(all)) {
      const links = match[1].split(/\s*[,;]\s*/).map((ref) => makeLink(ref));
      if (links.some((link) => !link)) continue;
      fragment.append(document.createTextNode(text.slice(last, match.index)), ...links);
      last = match.index + match[0].length;
    }
    fragment.append(document.createTextNode(text.slice(last)));
    node.replaceWith(fragment);
  }
}
