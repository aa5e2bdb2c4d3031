// The link graph: members on a circle, anonymous replicas in a row below them, one arrow per
// replication link in the direction rows flow (upstream -> the node whose applier reads it),
// coloured by the applier's state and labelled with its lag. Hovering a link shows its
// per-peer id map; hovering a node shows its vclock.

import { h, lag, replace, s, short } from "./dom.js";

const W = 460;
const NODE_R = 23;
const LAG_SHOWN_S = 0.1;         // a link this close to live needs no label (hover tells the figure)
let hovered = null;              // {key, kind} of the element under the pointer

export function statusClass(status) {
  if (status === "follow" || status === "subscribed") return "ok";
  if (status === "connecting" || status === "resubscribing" || status === "joining") return "warn";
  if (status === "stopped") return "idle";
  return "bad";
}

function layout(nodes) {
  const members = nodes.filter((n) => !n.anon);
  const anon = nodes.filter((n) => n.anon);
  const ringH = members.length > 1 ? 250 : 110;
  const height = ringH + (anon.length ? 100 : 10);
  const cx = W / 2, cy = ringH / 2 + 10, r = Math.min(105, ringH / 2 - NODE_R - 12);
  const pos = new Map();          // node -> [x, y, label dx, label dy]: labels point away from the ring's centre
  members.forEach((n, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, members.length);
    if (members.length === 1) pos.set(n, [cx, cy, 0, NODE_R + 15]);
    else pos.set(n, [cx + r * Math.cos(a) * 1.35, cy + r * Math.sin(a), Math.cos(a) * (NODE_R + 26), Math.sin(a) * (NODE_R + 12) + 4]);
  });
  anon.forEach((n, i) => pos.set(n, [(W * (i + 1)) / (anon.length + 1), ringH + 55, 0, NODE_R + 15]));
  return { pos, height, divider: anon.length ? ringH + 12 : null };
}

export function linkGraph(model) {
  const { pos, height, divider } = layout(model.nodes);
  const svg = s("svg", { class: "graph", viewBox: `0 0 ${W} ${height}`, width: "100%", role: "img",
    "aria-label": "replication links between nodes" });
  svg.append(s("defs", {}, ["ok", "warn", "bad", "idle"].map((c) =>
    s("marker", { id: `arrow-${c}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0 L10,5 L0,10 z", class: `arrowhead ${c}` })))));
  if (divider !== null) {
    svg.append(s("line", { x1: 16, x2: W - 16, y1: divider, y2: divider, class: "divider" }),
      s("text", { x: 18, y: divider + 15, class: "divider-label" }, "anonymous replicas"));
  }
  for (const l of model.links) {
    if (!l.from || !pos.has(l.from)) continue;
    svg.append(edge(l, pos.get(l.from), pos.get(l.to)));
  }
  for (const n of model.nodes) svg.append(vertex(n, pos.get(n)));
  return svg;
}

function edge(l, [x1, y1], [x2, y2]) {
  const quiet = l.applier.status === "follow" && !l.stale && l.applier.lag_s < LAG_SHOWN_S;
  const dx = x2 - x1, dy = y2 - y1, len = Math.hypot(dx, dy) || 1;
  const ux = dx / len, uy = dy / len;
  const bend = 16;                                   // A->B and B->A bow to opposite sides
  const mx = (x1 + x2) / 2 - uy * bend, my = (y1 + y2) / 2 + ux * bend;
  const sx = x1 + ux * NODE_R - uy * 6, sy = y1 + uy * NODE_R + ux * 6;
  const ex = x2 - ux * (NODE_R + 2) - uy * 6, ey = y2 - uy * (NODE_R + 2) + ux * 6;
  const cls = l.stale ? "idle" : statusClass(l.applier.status);
  const d = `M${sx.toFixed(1)},${sy.toFixed(1)} Q${mx.toFixed(1)},${my.toFixed(1)} ${ex.toFixed(1)},${ey.toFixed(1)}`;
  const lx = 0.25 * sx + 0.5 * mx + 0.25 * ex - uy * 9, ly = 0.25 * sy + 0.5 * my + 0.25 * ey + ux * 9;
  const remapped = Object.entries(l.applier.id_map || {}).some(([k, v]) => Number(k) !== v);
  const g = s("g", { class: ["edge", cls, remapped && "remapped"], dataset: { tipKey: `link:${l.key}` } },
    s("path", { d, class: "edge-hit" }),
    s("path", { d, class: "edge-line", "marker-end": `url(#arrow-${cls})` }),
    quiet ? null : s("text", { x: lx.toFixed(1), y: (ly + 3).toFixed(1), class: ["edge-label", l.applier.status !== "follow" && "bad"] },
      l.stale ? "?" : l.applier.status === "follow" ? lag(l.applier.lag_s) : l.applier.status));
  hover(g, `link:${l.key}`);
  return g;
}

function vertex(n, [x, y, ldx, ldy]) {
  const g = s("g", { class: ["vertex", n.up ? "up" : "down", n.anon && "anon", n.expelled && "expelled"],
    dataset: { tipKey: `node:${n.base}`, node: n.uuid || "" } },
    s("circle", { cx: x, cy: y, r: NODE_R, class: "vertex-body" }),
    s("text", { x, y: y + 5, class: "vertex-id" }, n.ownId ?? "?"),
    s("text", { x: x + ldx, y: y + ldy, class: "vertex-label" }, n.label));
  hover(g, `node:${n.base}`);
  return g;
}

function hover(el, key) {
  el.addEventListener("mouseenter", (ev) => { hovered = { key }; showTip(ev); });
  el.addEventListener("mousemove", (ev) => place(ev));
  el.addEventListener("mouseleave", hideTip);
}

function hideTip() {
  hovered = null;
  document.getElementById("tooltip").hidden = true;
}

// Every render replaces the graph's elements, and an element removed under the pointer gets no
// mouseleave: whatever the pointer reaches that is not a hover target hides the tooltip too.
document.addEventListener("mouseover", (ev) => {
  if (hovered && !(ev.target instanceof Element && ev.target.closest("[data-tip-key]"))) hideTip();
});

let lastModel = null;
function showTip(ev) {
  if (lastModel) fillTip(lastModel);
  place(ev);
}

function place(ev) {
  const tip = document.getElementById("tooltip");
  tip.hidden = false;
  const right = ev.clientX + 14 + tip.offsetWidth + 8 <= window.innerWidth;   // else flip to the pointer's left
  const x = right ? ev.clientX + 14 : Math.max(8, ev.clientX - 14 - tip.offsetWidth);
  const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
  tip.style.left = `${x}px`;
  tip.style.top = `${y}px`;
}

// Called after every render: the tooltip follows the data while the pointer stays.
export function refreshTooltip(model) {
  lastModel = model;
  if (hovered) fillTip(model);
}

function fillTip(model) {
  if (hovered.key.startsWith("link:")) {
    const l = model.links.find((x) => `link:${x.key}` === hovered.key);
    if (!l) return;
    const from = l.from ? l.from.label : l.fromAddress;
    const pairs = Object.entries(l.applier.id_map || {}).sort((a, b) => Number(a[0]) - Number(b[0]));
    replace("tooltip", 
      h("div", { class: "tip-title mono" }, `${from} → ${l.to.label}`),
      h("div", {}, `applier on ${l.to.label}: `, h("b", {}, l.applier.status), l.applier.status === "follow" ? ` · lag ${lag(l.applier.lag_s)}` : ""),
      l.relay ? h("div", { class: "muted" }, `relay on ${from}: ${l.relay.status} · ${l.relay.rows_sent} rows sent`) : null,
      h("div", { class: "tip-sub" }, `id map: ${from}'s id → ${l.to.label}'s id`),
      pairs.length ? h("table", { class: "tip-map" }, pairs.map(([k, v]) => {
        const who = memberWithId(model, l.to, v);
        return h("tr", { class: Number(k) !== v ? "remap" : "" }, h("td", { class: "mono" }, k), h("td", {}, "→"),
          h("td", { class: "mono" }, String(v)), h("td", { class: "muted" }, who ? who.label : ""));
      })) : h("div", { class: "muted" }, "(not built yet: no handshake)"),
      (l.applier.error || l.lastError) ? h("div", { class: "err" }, `last error: ${l.applier.error || l.lastError.error}`) : null);
  } else {
    const n = model.nodes.find((x) => `node:${x.base}` === hovered.key);
    if (!n) return;
    const vc = n.snap ? Object.entries(n.snap.info.vclock) : [];
    replace("tooltip", 
      h("div", { class: "tip-title mono" }, n.address),
      h("div", { class: "muted mono" }, n.uuid || "uuid unknown"),
      h("div", {}, n.up ? (n.snap.info.status) : `${n.everUp ? "down" : "unreachable"}: ${n.error}`),
      vc.length ? h("div", { class: "mono" }, `vclock {${vc.map(([k, v]) => `${k}: ${v}`).join(", ")}}`) : null,
      n.snap ? h("div", { class: "muted" }, `cluster ${short(n.snap.info.cluster_uuid)} · wal_mode ${n.snap.info.wal_mode}`) : null);
  }
}

function memberWithId(model, node, id) {
  for (const m of model.members) {
    const got = m.ids.get(node.uuid);
    if (got && got.id === id) return m;
  }
  return null;
}
