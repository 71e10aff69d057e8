// The interface's language: every label the web shows goes through t(), which looks it up in the chosen
// locale's message catalogue (web/js/i18n/<locale>.js). Keys are the English texts themselves (gettext's way),
// so the code reads as it shows in English; placeholders are {name}. A value may be {one, other, …} for plurals,
// chosen by Intl.PluralRules from the `count` parameter.
//
// The locale is the one remembered from the settings' switch (localStorage), else the browser's first
// preference we have a catalogue for (navigator.languages), else English. <html lang> follows it. Dates,
// numbers and relative times are formatted by Intl in that locale (see formatDate, formatNumber, relativeTime).
// tests/unit/test_web_i18n.py fails on a key missing from a catalogue, or used in the code but in none.

import en from "./i18n/en.js";
import fr from "./i18n/fr.js";

export const CATALOGUES = { en, fr };
/** The locales the settings offer, each named in its own language. */
export const LOCALES = [
  ["en", "English"],
  ["fr", "Français"],
];
export const DEFAULT_LOCALE = "en";
const STORAGE_KEY = "rag-chat.locale";

function stored() {
  try {
    return localStorage.getItem(STORAGE_KEY);
  } catch {
    return null; // storage disabled: the browser's language decides
  }
}

/** The locale to use: the remembered choice, else the browser's, else English. */
export function detectLocale(preferences = navigator.languages || [navigator.language]) {
  const chosen = stored();
  if (chosen && CATALOGUES[chosen]) return chosen;
  for (const tag of preferences || []) {
    const base = String(tag || "").toLowerCase().split("-")[0];
    if (CATALOGUES[base]) return base;
  }
  return DEFAULT_LOCALE;
}

let locale = detectLocale();
document.documentElement.lang = locale;

export function currentLocale() {
  return locale;
}

/** Remembers `next` and shows the whole interface in it (a reload re-renders every view in the new locale). */
export function setLocale(next) {
  if (!CATALOGUES[next]) return;
  try {
    localStorage.setItem(STORAGE_KEY, next);
  } catch {
    // Not remembered, but this page still switches.
  }
  if (next === locale) return;
  locale = next;
  document.documentElement.lang = next;
  location.reload();
}

/** The label `key` in the current locale (English, then the key itself, when missing), with {params} filled. */
export function t(key, params) {
  let value = CATALOGUES[locale]?.[key] ?? en[key] ?? key;
  if (value && typeof value === "object") {
    const count = Number(params?.count ?? 0);
    value = value[new Intl.PluralRules(locale).select(count)] ?? value.other ?? key;
  }
  if (!params) return value;
  return value.replace(/\{(\w+)\}/g, (whole, name) => {
    if (!(name in params)) return whole;
    const param = params[name];
    return typeof param === "number" ? formatNumber(param) : String(param);
  });
}

export function formatNumber(value, options) {
  return new Intl.NumberFormat(locale, options).format(value);
}

/** A date (and time, with `{time: true}`) in the locale's own order and names. */
export function formatDate(value, { time = false } = {}) {
  const date = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(date.getTime())) return "";
  const options = time ? { dateStyle: "medium", timeStyle: "short" } : { dateStyle: "medium" };
  return new Intl.DateTimeFormat(locale, options).format(date);
}

/** "3 min ago", "yesterday", or a date: for chat lists and document tables. */
export function relativeTime(value) {
  if (!value) return "";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return "";
  const seconds = (Date.now() - date.getTime()) / 1000;
  const rtf = new Intl.RelativeTimeFormat(locale, { numeric: "auto" });
  if (seconds < 45) return t("just now");
  if (seconds < 3600) return rtf.format(-Math.round(seconds / 60), "minute");
  if (seconds < 86400) return rtf.format(-Math.round(seconds / 3600), "hour");
  if (seconds < 7 * 86400) return rtf.format(-Math.round(seconds / 86400), "day");
  return formatDate(date);
}

/** A language's name in the interface's language ("ko" → "Korean" / "coréen"), by Intl.DisplayNames. */
export function languageName(code) {
  if (!code) return "";
  try {
    return new Intl.DisplayNames([locale], { type: "language" }).of(code) || code;
  } catch {
    return code;
  }
}
