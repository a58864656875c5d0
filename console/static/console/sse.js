// Server-Sent Events read from a fetch() Response body (a ReadableStream): each event's `data` as it arrives.

/**
 * Yield the `data` of every event of `response`'s SSE body, in order, as soon as its blank line
 * arrives ("[DONE]" included, as the string). Multi-line data is joined with "\n" (the SSE rule);
 * comments and other fields are skipped. Ends when the body ends; throws what the reader throws
 * (an AbortError when the caller aborts the fetch).
 */
export async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = done ? "" : events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""));
      if (data.length) yield data.join("\n");
    }
    if (done) return;
  }
}
