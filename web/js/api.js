import { parseFrames } from "./sse.js";
import { t } from "./i18n.js";

// The gateway's REST API (GATEWAY_API.md): the one place that knows URLs, the token and error shapes.

/** An error answer from the gateway, `{"error", "code", "field"?}`, or a network failure (status 0). */
export class ApiError extends Error {
  constructor(status, message, code = "", field = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

// The session is the gateway's HttpOnly cookie: this page never sees the token (no script can read it), every
// tab shares it, and the browser sends it with each same-origin request. The page only remembers who it is.
export const session = {
  user: null,
  setUser(user) {
    this.user = user;
  },
  clear() {
    this.user = null;
  },
};

let onUnauthorized = () => {};

/** Called with no argument whenever the gateway answers 401 to a signed-in request. */
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

// The gateway's refusals a user commonly meets, by their stable `code`, in the interface's language (the
// gateway's `error` text is English). Any other code, or a known one whose figure is missing, keeps the
// server's text. tests/unit/test_web_i18n.py checks every code here is one the gateway (or the worker) sends.
const KNOWN_ERRORS = {
  bad_credentials: () => t("Wrong username or password, or the account is disabled."),
  login_throttled: ({ retry }) => retry && t("Too many failed logins: try again in {seconds} s.", { seconds: retry }),
  rate_limited: ({ retry }) => retry && t("Too many requests: try again in {seconds} s.", { seconds: retry }),
  account_disabled: () => t("This account has been disabled by an administrator."),
  token_expired: () => t("Your session has expired: sign in again."),
  username_taken: () => t("This username is taken."),
  registration_closed: () => t("Registration is closed on this server: ask an administrator."),
  wrong_password: () => t("The current password is wrong."),
  turn_in_progress: () => t("A reply is still being written in this chat: wait for it to finish, or stop it."),
  too_many_turns: () => t("You already have as many replies being written as you may: wait for one to finish."),
  too_many_uploads: () => t("You already have as many files being indexed as you may: wait for one to finish."),
  turn_running: () => t("The answer is still being written; rate it once it has finished."),
  empty_file: () => t("The file is empty."),
  busy: () => t("The server is busy answering others: try again in a moment."),
};

/** The text to show for the gateway's error `body` (`{"error", "code"}`): a known code's in the interface's
 * language, else the server's own message, else `fallback`. */
export function errorText(body, fallback = "", retryAfter = null) {
  const retry = /^\d+$/.test(retryAfter ?? "") ? Number(retryAfter) : null;
  const known = KNOWN_ERRORS[body?.code]?.({ retry });
  return known || body?.error || fallback;
}

async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON: a proxy page or an empty body */
  }
  const fallback = `${response.status} ${response.statusText || "error"}`.trim();
  const message = errorText(body, fallback, response.headers.get("Retry-After"));
  return new ApiError(response.status, message, body?.code || "", body?.field ?? null);
}

function checkUnauthorized(status, hadSession) {
  // A 401 on login itself means a wrong password, not an ended session.
  if (status === 401 && hadSession) {
    session.clear();
    onUnauthorized();
  }
}

/** fetch() with the session cookie; resolves to the raw Response when ok, throws ApiError otherwise. */
export async function send(method, path, { json, body, headers = {}, signal } = {}) {
  const hadSession = Boolean(session.user);
  const init = { method, headers: { ...headers }, signal, credentials: "same-origin" };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, t("The server cannot be reached. Check your connection and try again."), "network");
  }
  if (!response.ok) {
    checkUnauthorized(response.status, hadSession);
    throw await errorFrom(response);
  }
  return response;
}

async function call(method, path, json) {
  const response = await send(method, path, { json });
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// Lists may come bare or wrapped ({"chats": [...]}); accept both so a wrapper change is not a blank page.
function list(value, key) {
  if (Array.isArray(value)) return value;
  if (value && Array.isArray(value[key])) return value[key];
  return [];
}

/** "?a=1&b=2" from the filters that are set ("" when none is). */
function queryString(filters) {
  const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v !== undefined && v !== null && v !== ""));
  return query.size ? `?${query}` : "";
}

export const api = {
  register: (username, password) => call("POST", "/api/auth/register", { username, password }),
  login: (username, password) => call("POST", "/api/auth/login", { username, password }),
  me: () => call("GET", "/api/auth/me"),
  /** `{"user": {...}}` when this browser holds a valid session cookie, else `{"user": null}`. */
  currentSession: () => call("GET", "/api/auth/session"),
  /** Ends every session of this account (all tabs and devices) and clears the cookie. */
  logout: () => call("POST", "/api/auth/logout"),
  changePassword: (currentPassword, newPassword) =>
    call("POST", "/api/auth/password", { current_password: currentPassword, new_password: newPassword }),
  listUsers: () => call("GET", "/api/users"),
  /** The step log's statistics (administrators): per-stage medians and first-token latencies of `hours`. */
  turnStats: (hours = 24) => call("GET", `/api/admin/turn-stats?hours=${encodeURIComponent(hours)}`),
  setUserDisabled: (id, disabled) => call("PATCH", `/api/users/${encodeURIComponent(id)}`, { disabled }),
  /** An administrator's change to an account: `{disabled}` and/or `{is_admin}`. */
  updateUser: (id, fields) => call("PATCH", `/api/users/${encodeURIComponent(id)}`, fields),
  resetPassword: (id, newPassword) =>
    call("POST", `/api/users/${encodeURIComponent(id)}/password`, { new_password: newPassword }),

  /** This user's API keys (never their secrets). */
  listKeys: async () => list(await call("GET", "/api/keys"), "keys"),
  /** `{name, expires_at, read_only}`; the answer's `key` is the secret, shown this once. */
  createKey: (fields) => call("POST", "/api/keys", fields),
  revokeKey: (id) => call("DELETE", `/api/keys/${encodeURIComponent(id)}`),

  listChats: async () => list(await call("GET", "/api/chats"), "chats"),
  createChat: (fields = {}) => call("POST", "/api/chats", fields),
  getChat: (id) => call("GET", `/api/chats/${encodeURIComponent(id)}`),
  updateChat: (id, fields) => call("PATCH", `/api/chats/${encodeURIComponent(id)}`, fields),
  deleteChat: (id) => call("DELETE", `/api/chats/${encodeURIComponent(id)}`),
  /** Starts a streamed turn; the caller reads the SSE body (sse.js) and may abort with `signal`. */
  streamTurn: (id, body, signal) =>
    send("POST", `/api/chats/${encodeURIComponent(id)}/messages/stream`, {
      json: body,
      headers: { Accept: "text/event-stream" },
      signal,
    }),

  /** Stops the chat's running turn (on any gateway replica); resolves once the stopped turn is stored. */
  stopTurn: (id) => call("POST", `/api/chats/${encodeURIComponent(id)}/stop`),
  /** Rejoins the chat's running turn: SSE with a `snapshot` first, or a 204 response when none runs. */
  rejoinTurn: (id, signal) =>
    send("GET", `/api/chats/${encodeURIComponent(id)}/stream`, {
      headers: { Accept: "text/event-stream" },
      signal,
    }),

  /** Starts a (re)build of the index: SSE `progress` per file and stage, then `done` or `error`. */
  startBuild: (id, rebuild, signal) =>
    send("POST", `/api/indexes/${encodeURIComponent(id)}/build`, {
      json: { rebuild },
      headers: { Accept: "text/event-stream" },
      signal,
    }),
  /** Rejoins a running build: a `snapshot` first, then as startBuild; a 204 response when none runs. */
  rejoinBuild: (id, signal) =>
    send("GET", `/api/indexes/${encodeURIComponent(id)}/build`, {
      headers: { Accept: "text/event-stream" },
      signal,
    }),

  /** Jobs (uploads, rebuilds, syncs) of one index, newest first; `state` narrows them to one state. */
  listJobs: async (indexId, state) =>
    list(await call("GET", `/api/jobs${queryString({ index: indexId, state })}`), "jobs"),
  /** Follows a job from any tab or device: SSE `job` (the job) at once and on each change, `progress` per stage. */
  followJob: (id, signal) =>
    send("GET", `/api/jobs/${encodeURIComponent(id)}/events`, {
      headers: { Accept: "text/event-stream" },
      signal,
    }),
  getJob: (id) => call("GET", `/api/jobs/${encodeURIComponent(id)}`),
  cancelJob: (id) => call("POST", `/api/jobs/${encodeURIComponent(id)}/cancel`),

  listIndexes: async () => list(await call("GET", "/api/indexes"), "indexes"),
  createIndex: (name, description, { embedder, language } = {}) => call("POST", "/api/indexes", { name, description, embedder, language }),
  getIndex: (id) => call("GET", `/api/indexes/${encodeURIComponent(id)}`),
  deleteIndex: (id) => call("DELETE", `/api/indexes/${encodeURIComponent(id)}`),
  listDatasets: async (id) =>
    list(await call("GET", `/api/indexes/${encodeURIComponent(id)}/datasets`), "datasets"),
  deleteDocument: (indexId, documentId) =>
    call(
      "DELETE",
      `/api/indexes/${encodeURIComponent(indexId)}/documents/${encodeURIComponent(documentId)}`,
    ),
  downloadDocument: (indexId, documentId) =>
    send(
      "GET",
      `/api/indexes/${encodeURIComponent(indexId)}/documents/${encodeURIComponent(documentId)}/download`,
    ),

  updateIndex: (id, fields) => call("PATCH", `/api/indexes/${encodeURIComponent(id)}`, fields),
  listGrants: (id) => call("GET", `/api/indexes/${encodeURIComponent(id)}/grants`),
  /** `grant`: {subject_type: "user"|"group"|"everyone", username | group_id, role: "reader"|"editor"}. */
  addGrant: (id, grant) => call("POST", `/api/indexes/${encodeURIComponent(id)}/grants`, grant),
  updateGrant: (id, grantId, role) =>
    call("PATCH", `/api/indexes/${encodeURIComponent(id)}/grants/${encodeURIComponent(grantId)}`, { role }),
  removeGrant: (id, grantId) =>
    call("DELETE", `/api/indexes/${encodeURIComponent(id)}/grants/${encodeURIComponent(grantId)}`),
  transferIndex: (id, username, previousOwnerRole = "editor") =>
    call("POST", `/api/indexes/${encodeURIComponent(id)}/owner`, { username, previous_owner_role: previousOwnerRole }),

  listGroups: () => call("GET", "/api/groups"),
  createGroup: (name, description = "") => call("POST", "/api/groups", { name, description }),
  updateGroup: (id, fields) => call("PATCH", `/api/groups/${encodeURIComponent(id)}`, fields),
  deleteGroup: (id) => call("DELETE", `/api/groups/${encodeURIComponent(id)}`),
  addMember: (id, username) => call("POST", `/api/groups/${encodeURIComponent(id)}/members`, { username }),
  removeMember: (id, userId) =>
    call("DELETE", `/api/groups/${encodeURIComponent(id)}/members/${encodeURIComponent(userId)}`),
  /** One page of the audit log (newest first): `filters` {action, actor_id, object_type, object_id, before, limit}. */
  listAudit: (filters = {}) => {
    const query = new URLSearchParams(Object.entries(filters).filter(([, v]) => v !== undefined && v !== null && v !== ""));
    return call("GET", `/api/audit${query.size ? `?${query}` : ""}`);
  },
  /** One cited source of a stored answer, resolved to its document today (gateway/sources.py). */
  openSource: (chatId, messageId, ref) =>
    call(
      "GET",
      `/api/chats/${encodeURIComponent(chatId)}/messages/${encodeURIComponent(messageId)}/sources/${encodeURIComponent(ref)}`,
    ),
  /** A document's converted text, passage by passage (the URL the source gave as `text_url`). */
  documentText: (textUrl) => call("GET", textUrl),
  /** The ratings of a chat's answers: `{"feedback": {message_id: {...}}}`. */
  chatFeedback: (chatId) => call("GET", `/api/chats/${encodeURIComponent(chatId)}/feedback`),
  rateMessage: (chatId, messageId, fields) =>
    call("PUT", `/api/chats/${encodeURIComponent(chatId)}/messages/${encodeURIComponent(messageId)}/feedback`, fields),
  unrateMessage: (chatId, messageId) =>
    call("DELETE", `/api/chats/${encodeURIComponent(chatId)}/messages/${encodeURIComponent(messageId)}/feedback`),
  /** One page of rated answers for review, newest first: `filters` {index_id, rating, since, until, limit, offset}. */
  listFeedback: (filters = {}) => call("GET", `/api/feedback${queryString(filters)}`),
  /** The review list as JSON lines with the same filters (a Response: the caller saves its blob). */
  exportFeedback: (filters = {}) => send("GET", `/api/feedback/export${queryString(filters)}`),
  /** A chat as a file: format "markdown" or "json" (a Response: the caller saves its blob). */
  exportChat: (chatId, format) =>
    send("GET", `/api/chats/${encodeURIComponent(chatId)}/export?format=${encodeURIComponent(format)}`),

  getSettings: () => call("GET", "/api/settings"),
  putSettings: (settings) => call("PUT", "/api/settings", settings),
};

/**
 * Uploads one file with XMLHttpRequest, because fetch() reports no upload progress.
 * `onProgress(fraction)` is called as bytes leave, `onQueued(job)` once the gateway stored the file as a job
 * (which goes on if this page goes), `onStage(progress)` per indexing stage; resolves to the stored document.
 */
export function uploadDocument(indexId, file, dataset, onProgress, onStage = () => {}, onQueued = () => {}) {
  return new Promise((resolve, reject) => {
    const hadSession = Boolean(session.user);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/api/indexes/${encodeURIComponent(indexId)}/documents`);
    // The indexing stages come back as server-sent events while the worker runs them.
    xhr.setRequestHeader("Accept", "text/event-stream");
    xhr.responseType = "text";
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    });
    xhr.upload.addEventListener("load", () => onProgress(1));
    let parsed = 0;
    let last = null;
    const readFrames = () => {
      if (!(xhr.getResponseHeader("Content-Type") || "").startsWith("text/event-stream")) return;
      const text = xhr.responseText;
      const end = text.lastIndexOf("\n\n");
      if (end < parsed) return;
      const { events } = parseFrames(text.slice(parsed, end + 2));
      parsed = end + 2;
      for (const { event, data } of events) {
        let payload = null;
        try {
          payload = JSON.parse(data);
        } catch {
          continue;
        }
        if (event === "progress") onStage(payload);
        else if (event === "queued") onQueued(payload);
        else last = { event, payload };
      }
    };
    xhr.addEventListener("progress", readFrames);
    xhr.addEventListener("load", () => {
      let body = null;
      if (xhr.status >= 200 && xhr.status < 300 && (xhr.getResponseHeader("Content-Type") || "").startsWith("text/event-stream")) {
        readFrames();
        if (last?.event === "done") resolve(last.payload);
        else reject(new ApiError(xhr.status, last?.payload?.error || t("Indexing stopped before it finished."), last?.payload?.code || "interrupted"));
        return;
      }
      try {
        body = xhr.responseText ? JSON.parse(xhr.responseText) : null;
      } catch {
        /* not JSON */
      }
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve(body);
        return;
      }
      checkUnauthorized(xhr.status, hadSession);
      const fallback = `${xhr.status} ${xhr.statusText || "error"}`.trim();
      const message = errorText(body, fallback, xhr.getResponseHeader("Retry-After"));
      reject(new ApiError(xhr.status, message, body?.code || "", body?.field ?? null));
    });
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, t("The upload was cut off. Check your connection and try again."), "network")),
    );
    const form = new FormData();
    form.append("dataset", dataset);
    form.append("file", file, file.name);
    xhr.send(form);
  });
}
