// One live stream per node: GET /v1/events read with fetch() and a ReadableStream, because
// EventSource cannot send the Authorization header and the token must never be put in a URL
// (URLs land in logs and browser history).
//
// Rules kept here:
// - A stream is "up" from its first snapshot until it ends, fails, or stays silent for
//   STALE_S (a node stopped with SIGSTOP or a dead network sends no FIN): then "down".
// - It reconnects with capped exponential backoff, forever: a node that comes back shows up again.
// - A 401 is reported as such (the page asks for the token) and retried only after the
//   token changes.

const STALE_S = 5;            // no snapshot for this long: the node is down (snapshots come every ~1 s)
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 5000;

export class EventStream {
  // base: "http://host:port"; handlers: {snapshot(obj), state({up, error, status})}
  constructor(base, getToken, handlers) {
    this.base = base;
    this.getToken = getToken;
    this.handlers = handlers;
    this.stopped = false;
    this.controller = null;
    this.waitToken = null;
  }

  start() {
    this.loop();
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
  }

  // The token changed: a stream parked on 401 tries again at once.
  retry() {
    if (this.waitToken) { this.waitToken(); this.waitToken = null; }
    else if (this.controller) this.controller.abort();
  }

  async loop() {
    let backoff = BACKOFF_MIN_MS;
    while (!this.stopped) {
      let got = false;
      try {
        got = await this.once();
        this.handlers.state({ up: false, error: "connection closed by the node" });
      } catch (e) {
        if (e && e.status === 401) {
          this.handlers.state({ up: false, error: "a valid token is required", status: 401 });
          await new Promise((resolve) => { this.waitToken = resolve; });
          continue;
        }
        this.handlers.state({ up: false, error: describe(e), status: e && e.status });
      }
      if (got) backoff = BACKOFF_MIN_MS;
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    }
  }

  // One connection; resolves true if at least one snapshot arrived, throws on failure.
  async once() {
    const controller = new AbortController();
    this.controller = controller;
    const headers = { Accept: "text/event-stream" };
    const token = this.getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    let stale = null;
    const arm = () => {
      clearTimeout(stale);
      stale = setTimeout(() => controller.abort(new Error(`no snapshot for ${STALE_S} s`)), STALE_S * 1000);
    };
    arm();
    let got = false;
    try {
      const resp = await fetch(`${this.base}/v1/events`, { headers, signal: controller.signal, cache: "no-store", credentials: "omit" });
      if (!resp.ok) {
        let message = `HTTP ${resp.status}`;
        try { message = (await resp.json()).error.message; } catch (_) { /* not our JSON */ }
        const err = new Error(message);
        err.status = resp.status;
        throw err;
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (e) {
          if (controller.signal.aborted) throw e;
          throw new Error("connection lost");
        }
        const { value, done } = chunk;
        if (done) return got;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
          if (!data) continue;
          arm();
          got = true;
          this.handlers.snapshot(JSON.parse(data));
        }
      }
    } catch (e) {
      if (controller.signal.aborted && controller.signal.reason instanceof Error) throw controller.signal.reason;
      throw e;
    } finally {
      clearTimeout(stale);
      controller.abort();
    }
  }
}

function describe(e) {
  if (!e) return "unreachable";
  if (e instanceof TypeError) return "unreachable (connection refused, network, or not allowed by CORS)";
  return e.message || String(e);
}
