// Server-sent events over a POST response. EventSource only does GET, so the frames are parsed here
// from fetch()'s ReadableStream, following the HTML spec's event-stream rules.

/**
 * Parses complete frames out of `buffer`; returns the events found and the unparsed remainder.
 * A frame ends at a blank line; `event:` names it, `data:` lines are joined with "\n",
 * lines starting with ":" are comments (keepalives) and are skipped.
 */
export function parseFrames(buffer) {
  const events = [];
  const normalised = buffer.replace(/\r\n?/g, "\n");
  const frames = normalised.split("\n\n");
  const rest = frames.pop();
  for (const frame of frames) {
    let name = "message";
    const data = [];
    for (const line of frame.split("\n")) {
      if (line === "" || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    if (data.length) events.push({ event: name, data: data.join("\n") });
  }
  return { events, rest };
}

/**
 * Yields `{event, data}` for each frame of `response`'s body, with `data` parsed as JSON.
 * Returns normally when the stream ends, whether or not the server sent its last event:
 * the caller decides what a missing `done` means. Throws AbortError when the caller aborts.
 */
export async function* readEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const parsed = parseFrames(buffer);
      buffer = parsed.rest;
      for (const { event, data } of parsed.events) {
        let payload;
        try {
          payload = JSON.parse(data);
        } catch {
          payload = { raw: data };
        }
        yield { event, data: payload };
      }
    }
  } finally {
    // Leaving early (the caller stopped reading) must cancel the request, not leave it running.
    reader.cancel().catch(() => {});
  }
}
