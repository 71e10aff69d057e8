// What an index may be made with (contract/languages.py; tests/unit/test_web_i18n.py checks they agree): its
// embedding model, and the language of its full-text index (a stemmer, or n-grams for Chinese, Japanese, Korean).

export const EMBEDDERS = ["default", "multilingual-e5-small"];
export const DEFAULT_EMBEDDER = "default";
export const INDEX_LANGUAGES = [
  "ar", "da", "de", "el", "en", "es", "fi", "fr", "hu", "it", "ja", "ko", "nl", "no", "pt", "ro", "ru", "sv",
  "ta", "tr", "zh",
];
export const DEFAULT_INDEX_LANGUAGE = "en";
