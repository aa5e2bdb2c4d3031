// The dashboard's state: which nodes exist, what each last said, and since when a node is down.
//
// Rules kept here:
// - Members are discovered from the node that served this page (its `_cluster`, its links), then
//   from every node reached; each node is read directly over its own stream (that node answers
//   CORS for pages served by members), never through another node.
// - A node once seen stays on the page; when its stream fails it is marked down, with the time
//   it went down, and its last snapshot is kept (greyed) until it comes back.
// - The token comes from the URL fragment (#token=..., which browsers never send to a server)
//   or from the form the page shows on a 401, and is kept in sessionStorage for this tab only.
//   It is removed from the address bar at once.
// - The token goes to the node that served this page, and to another node only once the user
//   has asked for it on that node's card, which names its address: member addresses are learned
//   from the cluster, and anyone holding the cluster secret can register a member at an address
//   it listens on (the client token never travels to a learned address, docs/operations.md).

import { EventStream } from "./stream.js";
import { render, tick } from "./views.js";

const TOKEN_KEY = "replog.token";
const SHARED_KEY = "replog.token.shared";   // other nodes (base URLs) the user sent the token to, this tab only
const HISTORY_SAMPLES = 61;     // one a second: a minute of rates in the sparklines

export const state = {
  nodes: new Map(),             // base URL -> node record (see nodeRecord)
  needToken: false,
  served: location.origin,
};

function takeTokenFromFragment() {
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function shared() {
  try {
    const list = JSON.parse(sessionStorage.getItem(SHARED_KEY) || "[]");
    return Array.isArray(list) ? list : [];
  } catch (_) {
    return [];
  }
}

// The token for one node's stream: its own page's node, or a node the user chose.
function tokenFor(base) {
  return base === state.served || shared().includes(base) ? token() : "";
}

// The user asked for the token to go to this node (a button on its card names its address).
function shareToken(base) {
  const list = shared();
  if (!list.includes(base)) {
    list.push(base);
    sessionStorage.setItem(SHARED_KEY, JSON.stringify(list));
  }
  if (!token()) showTokenForm(true);
  const rec = state.nodes.get(base);
  if (rec) rec.stream.retry();
}
state.shareToken = shareToken;

function nodeRecord(base, hint) {
  return {
    base,
    uuid: hint.uuid || null,
    address: hint.address || base.replace(/^https?:\/\//, ""),
    snap: null,            // the last snapshot (kept while down)
    history: [],           // [{t, written, applied}]
    up: false,
    everUp: false,
    downSince: Date.now(),
    error: "connecting…",
    status: null,
    linkErrors: new Map(), // upstream address -> {error, at}: the last error of each link, kept after it heals
    stream: null,
  };
}

function baseFor(address) {
  return `${location.protocol}//${address}`;
}

function ensureNode(base, hint = {}) {
  let rec = state.nodes.get(base);
  if (rec) {
    if (!rec.uuid && hint.uuid) rec.uuid = hint.uuid;
    return rec;
  }
  for (const other of state.nodes.values()) {          // a node we already read, under this or another address
    if (other.snap && (other.snap.info.address === hint.address || (hint.uuid && other.uuid === hint.uuid))) return other;
  }
  rec = nodeRecord(base, hint);
  state.nodes.set(base, rec);
  rec.stream = new EventStream(base, () => tokenFor(base), {
    snapshot: (snap) => onSnapshot(rec, snap),
    state: (st) => onStreamState(rec, st),
  });
  rec.stream.start();
  return rec;
}

function onSnapshot(rec, snap) {
  const info = snap.info;
  rec.snap = snap;
  rec.uuid = info.uuid;
  rec.address = info.address;
  if (!rec.up) { rec.up = true; rec.everUp = true; rec.downSince = null; rec.error = ""; rec.status = null; }
  rec.history.push({ t: snap.t, written: snap.counters.rows_written, applied: snap.counters.rows_applied });
  if (rec.history.length > HISTORY_SAMPLES) rec.history.shift();
  for (const u of info.upstreams) {
    if (u.error) rec.linkErrors.set(u.address, { error: u.error, at: Date.now() });
  }
  discover(snap);
  schedule();
}

function onStreamState(rec, st) {
  if (rec.up || rec.downSince === null) rec.downSince = Date.now();
  rec.up = false;
  rec.error = st.error;
  rec.status = st.status || null;
  // The form asks for the token when a node that would be sent it says 401.
  state.needToken = [...state.nodes.values()].some((n) => n.status === 401 && (n.base === state.served ||
    (!token() && shared().includes(n.base))));
  showTokenForm(state.needToken);
  schedule();
}

// Every address a snapshot names: members (not expelled), and both ends of its links
// (anonymous replicas are in no master's `_cluster`; they are found as downstreams).
function discover(snap) {
  const seen = [];
  for (const m of snap.cluster.members) {
    if (m.state !== "expelled" && m.address) seen.push({ uuid: m.uuid, address: m.address });
  }
  for (const l of [...snap.info.downstreams, ...snap.info.upstreams]) {
    if (l.address) seen.push({ uuid: l.uuid, address: l.address });
  }
  for (const hint of seen) {
    if (hint.address === snap.info.address || hint.uuid === snap.info.uuid) continue;   // itself
    ensureNode(baseFor(hint.address), hint);
  }
}

let pending = null;
function schedule() {
  if (pending === null) pending = setTimeout(() => { pending = null; render(state); }, 80);
}

function showTokenForm(show) {
  const form = document.getElementById("token-form");
  form.hidden = !show;
  if (show && document.activeElement !== form.elements.token) form.elements.token.focus();
}

function setupTokenForm() {
  const form = document.getElementById("token-form");
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, form.elements.token.value.trim());
    form.elements.token.value = "";
    form.hidden = true;
    for (const rec of state.nodes.values()) rec.stream.retry();
  });
  document.getElementById("token-button").addEventListener("click", () => showTokenForm(form.hidden));
}

takeTokenFromFragment();
setupTokenForm();
ensureNode(state.served, { address: location.host });
setInterval(tick, 1000);   // "down for N s" counts on between snapshots
render(state);
