// The dashboard's panels, rebuilt from the model on every batch of snapshots: node cards with
// rates and WAL, the id matrix, the vclock matrix, the link table. Cells carry data-member /
// data-node / data-origin attributes (uuids) so a test or a script can find them.

import { bytes, duration, h, lag, rate, replace, short, sparkline } from "./dom.js";
import { linkGraph, refreshTooltip, statusClass } from "./graph.js";
import { buildModel, idCell, rates } from "./model.js";

const HOLD_QUIET_S = 10;          // a subscriber silent this long while its position holds the WAL is worth a colour
const previousLsn = new Map();   // "origin|node" -> lsn, to flash cells that moved

let lastModel = null;

export function render(state) {
  const model = buildModel(state);
  lastModel = model;
  renderHeader(model);
  replace("nodes", model.nodes.map((n) => card(n, model)));
  replace("ids", idMatrix(model));
  replace("vclocks", vclockMatrix(model));
  replace("graph", linkGraph(model));
  replace("links", linkTable(model));
  refreshTooltip(model);
  tick();
}

// Once a second: the clocks of nodes that are down, and the header's freshness.
export function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("[data-down-since]")) {
    el.textContent = `${el.dataset.downWord} ${duration((now - Number(el.dataset.downSince)) / 1000)}`;
  }
  const nodes = lastModel ? lastModel.nodes : [];
  const up = nodes.filter((n) => n.up).length;
  const live = document.getElementById("live");
  live.textContent = `${up} of ${nodes.length} nodes live`;
  live.className = up === nodes.length ? "live ok" : "live warn";
}

function renderHeader(model) {
  const c = model.clusterName;
  replace("cluster-name", c ? [h("strong", {}, c.name), h("span", { class: "muted mono" }, ` ${short(c.uuid)}`)] : "connecting…");
  const masters = model.nodes.filter((n) => !n.anon).length;
  const anon = model.nodes.length - masters;
  const remapped = model.members.reduce((k, m) => k + model.nodes.filter((n) => remappedCell(m, n)).length, 0);
  replace("summary",
    h("span", {}, `${masters} member${masters === 1 ? "" : "s"}`),
    anon ? h("span", {}, `${anon} anonymous`) : null,
    h("span", { class: remapped ? "pill remap" : "pill" }, `${remapped} remapped id${remapped === 1 ? "" : "s"}`),
    h("span", { class: "muted" }, "served by ", h("span", { class: "mono" }, location.host)));
}

function downLabel(n) {
  if (n.up) return null;
  const word = n.everUp ? "down" : "unreachable";
  return h("span", { class: "down-for", dataset: { downSince: String(n.downSince), downWord: word } }, word);
}

function card(n, model) {
  const info = n.snap ? n.snap.info : null;
  const role = n.expelled ? "expelled" : n.anon ? "anonymous" : info && info.read_only ? "read-only" : "master";
  const written = rates(n.history, "written");
  const applied = rates(n.history, "applied");
  const cls = ["card", n.up ? "up" : "down", n.anon && "anon", n.expelled && "expelled", !n.snap && "never"];
  return h("article", { class: cls, dataset: { node: n.uuid || "", address: n.address, state: n.up ? "up" : "down" } },
    h("header", { class: "card-head" },
      h("span", { class: ["dot", n.up ? statusClass(info.status === "running" ? "follow" : "connecting") : "bad"] }),
      h("span", { class: "addr mono" }, n.address),
      n.ownId != null ? h("span", { class: "badge id" }, `id ${n.ownId}`) : null,
      h("span", { class: ["badge", role] }, role)),
    h("div", { class: "card-sub muted" },
      h("span", { class: "mono" }, short(n.uuid)),
      !info ? "" : n.up ? ` · ${info.status}${info.status_reason ? ` (${info.status_reason})` : ""} · up ${duration(info.uptime_s)}`
        : ` · last seen ${new Date(n.snap.t * 1000).toLocaleTimeString()}`),
    n.up ? null : h("div", { class: "down-banner" }, downLabel(n), h("span", { class: "why" }, n.error || ""),
      n.status === 401 && n.base !== model.served
        ? h("button", { type: "button", class: "share-token", onclick: () => model.shareToken(n.base) },
          "send the token to ", h("span", { class: "mono" }, n.address))
        : null),
    h("div", { class: "metrics" },
      metric("writes/s", written, "w"),
      metric("applied/s", applied, "a")),
    n.snap ? walLine(n, model) : null);
}

function metric(label, series, cls) {
  const now = series.length ? series[series.length - 1] : null;
  return h("div", { class: "metric" },
    h("div", { class: "metric-top" }, h("span", { class: "muted" }, label), h("span", { class: ["metric-value", cls] }, rate(now))),
    sparkline(series, { cls }));
}

function walLine(n, model) {
  const w = n.snap.wal;
  const holds = w.holds.map((x) => {
    const who = model.byUuid.get(x.uuid);
    const label = who ? who.label : short(x.uuid);
    return h("span", { class: ["hold", x.anon && "anon", !x.holding && "released", x.holding && x.seen_s_ago > HOLD_QUIET_S && "stuck"],
      title: `${x.uuid}${x.anon ? " (anonymous)" : ""}: acknowledged ${x.seen_s_ago} s ago` +
             (x.holding ? "" : x.anon ? "; past anon_ttl_s, no longer holds the WAL" : "; expelled, no longer holds the WAL") },
      `${label} ${x.rows_behind ? `−${x.rows_behind}` : "✓"}`);
  });
  return h("div", { class: "wal" },
    h("span", {}, h("span", { class: "muted" }, "WAL "), `${bytes(w.bytes)} · ${w.segments} seg`),
    h("span", { class: "holds" }, h("span", { class: "muted" }, holds.length ? "held by " : "no holds"), holds));
}

function remappedCell(m, n) {
  const c = idCell(m, n);
  return Boolean(c && m.ownId != null && c.id !== m.ownId);
}

function nodeHeads(model) {
  return model.nodes.map((n) => h("th", { class: ["node-col", !n.up && "down", n.anon && "anon-col"], dataset: { node: n.uuid || "" } },
    h("div", { class: "mono" }, n.label), h("div", { class: "muted mono small" }, short(n.uuid))));
}

function memberHead(m) {
  return h("th", { class: "member", scope: "row" },
    h("span", { class: "mono" }, m.label), " ", h("span", { class: "muted mono small" }, short(m.uuid)),
    m.expelled ? h("span", { class: "badge expelled" }, "expelled") : null);
}

function idMatrix(model) {
  const section = (title, members) => members.length ? [
    h("tr", { class: "group" }, h("th", { colspan: model.nodes.length + 2 }, title)),
    members.map((m) => h("tr", { class: [m.expelled && "expelled"], dataset: { member: m.uuid } },
      memberHead(m),
      h("td", { class: "own mono" }, m.ownId ?? "?"),
      model.nodes.map((n) => {
        const c = idCell(m, n);
        const remapped = remappedCell(m, n);
        return h("td", { class: ["id", remapped && "remap", c && c.how !== "seen" && c.how, !c && "none", n.anon && "anon-col"],
          dataset: { member: m.uuid, node: n.uuid || "", id: c ? String(c.id) : "" },
          title: c ? `${n.address} calls ${m.uuid} id ${c.id}` + (remapped ? ` (it calls itself ${m.ownId})` : "") +
                 (c.how === "learned" ? " — learned from others (node not reached)" : c.how === "stale" ? " — last seen before the node went down" : "")
                   : `${n.address} has no id for this member` },
        c ? String(c.id) : "·");
      })))] : [];
  return h("table", { class: "matrix ids" },
    h("thead", {}, h("tr", {}, h("th", {}, "member"), h("th", { class: "own", title: "the id the member gives itself" }, "own"), nodeHeads(model))),
    h("tbody", {}, section("members", model.members.filter((m) => !m.anon)),
      section("anonymous replicas (in no master's _cluster)", model.members.filter((m) => m.anon))));
}

function vclockMatrix(model) {
  const origins = model.members.filter((m) => !m.anon);
  const rows = origins.map((m) => {
    const lsns = model.nodes.map((n) => (n.snap ? n.snap.info.vclock_uuid[m.uuid] ?? 0 : null));
    const max = Math.max(0, ...model.nodes.map((n, i) => (n.up ? lsns[i] ?? 0 : 0)));
    return h("tr", { class: [m.expelled && "expelled"], dataset: { origin: m.uuid } },
      memberHead(m),
      model.nodes.map((n, i) => {
        const lsn = lsns[i];
        if (lsn === null) return h("td", { class: "lsn none", dataset: { origin: m.uuid, node: n.uuid || "" } }, "·");
        const key = `${m.uuid}|${n.uuid}`;
        const moved = previousLsn.has(key) && previousLsn.get(key) < lsn;
        previousLsn.set(key, lsn);
        const behind = n.up ? max - lsn : 0;
        return h("td", { class: ["lsn mono", moved && "bump", !n.up && "stale", n.anon && "anon-col"],
          dataset: { origin: m.uuid, node: n.uuid || "", lsn: String(lsn) },
          title: `${n.address} has ${m.uuid}'s rows up to lsn ${lsn}` + (behind ? ` (${behind} behind the most advanced node)` : "") },
          String(lsn), behind > 0 ? h("span", { class: "behind-by" }, `−${behind}`) : null);
      }));
  });
  return h("table", { class: "matrix vclocks" },
    h("thead", {}, h("tr", {}, h("th", {}, "origin"), nodeHeads(model))),
    h("tbody", {}, rows));
}

function linkTable(model) {
  if (!model.links.length) return h("p", { class: "muted" }, "no replication links");
  return h("table", { class: "links" },
    h("thead", {}, h("tr", {}, ["from → to", "applier", "lag", "id map (from's id → to's id)", "last error"].map((t) => h("th", {}, t)))),
    h("tbody", {}, model.links.map((l) => h("tr", { class: [l.stale && "stale"], dataset: { link: l.key } },
      h("td", { class: "mono" }, `${l.from ? l.from.label : l.fromAddress} → ${l.to.label}`),
      h("td", {}, h("span", { class: ["state", statusClass(l.applier.status)] }, l.applier.status)),
      h("td", { class: "mono" }, lag(l.applier.lag_s)),
      h("td", { class: "mono" }, idMap(l.applier.id_map)),
      h("td", { class: "err" }, l.applier.error || (l.lastError ? `${l.lastError.error} (${duration((Date.now() - l.lastError.at) / 1000)} ago)` : ""))))));
}

export function idMap(map) {
  const pairs = Object.entries(map || {}).sort((a, b) => Number(a[0]) - Number(b[0]));
  if (!pairs.length) return h("span", { class: "muted" }, "—");
  return pairs.map(([k, v], i) => [i ? " " : "", h("span", { class: ["pair", Number(k) !== v && "remap"] }, `${k}→${v}`)]);
}
