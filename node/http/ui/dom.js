// Small DOM helpers for the dashboard: elements built from data, never from HTML strings
// (node addresses and peer error messages end up in the page: they must stay text),
// sparklines in SVG, and the formats every view shares.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// h("td", {class: "x", dataset: {node: uuid}}, "text", child, [more])
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function replace(id, ...children) {
  const el = document.getElementById(id);
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

export function short(uuid) {
  return uuid ? uuid.slice(0, 8) : "?";
}

export function duration(sec) {
  sec = Math.max(0, Math.floor(sec));
  if (sec < 60) return `${sec} s`;
  if (sec < 3600) return `${Math.floor(sec / 60)} m ${sec % 60} s`;
  return `${Math.floor(sec / 3600)} h ${Math.floor((sec % 3600) / 60)} m`;
}

export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function lag(sec) {
  if (sec === undefined || sec === null) return "";
  if (sec < 1) return `${Math.round(sec * 1000)} ms`;
  return `${sec.toFixed(1)} s`;
}

export function rate(x) {
  if (x === null || x === undefined) return "–";
  return x >= 100 ? Math.round(x).toString() : x.toFixed(1);
}

// A sparkline of the last samples (numbers, oldest first): a line over a soft area.
export function sparkline(values, { width = 132, height = 30, cls = "" } = {}) {
  const svg = s("svg", { class: ["spark", cls], width, height, viewBox: `0 0 ${width} ${height}`, "aria-hidden": "true" });
  if (values.length < 2) {
    svg.append(s("line", { x1: 0, y1: height - 1, x2: width, y2: height - 1, class: "spark-base" }));
    return svg;
  }
  const max = Math.max(1, ...values);
  const step = width / (values.length - 1);
  const pts = values.map((v, i) => [i * step, height - 2 - (v / max) * (height - 5)]);
  const line = pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  svg.append(
    s("polygon", { points: `0,${height} ${line} ${width},${height}`, class: "spark-area" }),
    s("polyline", { points: line, class: "spark-line" }),
    s("circle", { cx: pts[pts.length - 1][0] - 1.5, cy: pts[pts.length - 1][1], r: 2.2, class: "spark-dot" }),
  );
  return svg;
}
