// From what every node said to what the page shows: nodes (columns), members (rows), the id
// each node gives each member, vclocks by uuid, links, rates. No DOM here.
//
// Rules kept here:
// - A member's "own id" is the id it gives itself; a cell is remapped when a node gives that
//   member another id (the reference's case (a) makes two such cells per clashing pair).
// - A node that is down keeps its last snapshot, marked stale. A node never reached is filled
//   from what the others learned it calls each member (GROUP_CLUSTER rows), marked learned.
// - Anonymous replicas come after the members, in rows and columns of their own.

export function buildModel(state) {
  const nodes = dedupe([...state.nodes.values()]);
  const sameHost = new Set(nodes.map((n) => n.address.slice(0, n.address.lastIndexOf(":")))).size <= 1;
  const members = new Map();      // uuid -> member
  const anonUuids = new Set();
  for (const n of nodes) {
    if (n.snap && n.snap.info.anon) anonUuids.add(n.uuid);
    if (!n.snap) continue;
    for (const d of n.snap.info.downstreams) if (d.anon && d.uuid) anonUuids.add(d.uuid);
    for (const m of n.snap.cluster.members) {
      let e = members.get(m.uuid);
      if (!e) {
        e = { uuid: m.uuid, address: m.address, expelled: false, ids: new Map(), learned: new Map(), lsn: 0 };
        members.set(m.uuid, e);
      }
      if (m.state === "expelled") e.expelled = true;
      if (m.state === "anonymous") anonUuids.add(m.uuid);
      if (m.address && n.up) e.address = m.address;
      e.ids.set(n.uuid, { id: m.id, stale: !n.up });
      for (const [origin, id] of Object.entries(m.ids || {})) e.learned.set(origin, id);
    }
  }
  for (const n of nodes) {
    n.anon = anonUuids.has(n.uuid);
    n.expelled = Boolean(members.get(n.uuid) && members.get(n.uuid).expelled);
    n.label = labelOf(n.address, sameHost);
    n.ownId = n.snap ? n.snap.info.id : (members.get(n.uuid) ? members.get(n.uuid).learned.get(n.uuid) : null);
  }
  nodes.sort(byRole);
  for (const e of members.values()) {
    const self = nodes.find((n) => n.uuid === e.uuid);
    e.ownId = self && self.snap ? self.snap.info.id : (e.learned.has(e.uuid) ? e.learned.get(e.uuid) : null);
    e.anon = anonUuids.has(e.uuid);
    e.node = self || null;
    e.label = self ? self.label : labelOf(e.address, sameHost);
  }
  const rows = [...members.values()].sort((a, b) => byRole({ ...a, address: a.address || "" }, { ...b, address: b.address || "" }));
  return { nodes, members: rows, byUuid: members, sameHost, links: links(nodes), clusterName: clusterName(nodes),
    served: state.served, shareToken: state.shareToken };
}

// The id node `n` gives member `m`: {id, how: "seen"|"stale"|"learned"} or null.
export function idCell(m, n) {
  const got = m.ids.get(n.uuid);
  if (got) return { id: got.id, how: got.stale ? "stale" : "seen" };
  if (!n.snap && n.uuid && m.learned.has(n.uuid)) return { id: m.learned.get(n.uuid), how: "learned" };
  return null;
}

// Rows per second between consecutive samples (a restart's reset shows as 0, not negative).
export function rates(history, key) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const dt = history[i].t - history[i - 1].t;
    out.push(dt > 0 ? Math.max(0, history[i][key] - history[i - 1][key]) / dt : 0);
  }
  return out;
}

function links(nodes) {
  const byUuid = new Map(nodes.filter((n) => n.uuid).map((n) => [n.uuid, n]));
  const byAddress = new Map(nodes.map((n) => [n.address, n]));
  const out = [];
  for (const to of nodes) {
    if (!to.snap) continue;
    for (const u of to.snap.info.upstreams) {
      const from = (u.uuid && byUuid.get(u.uuid)) || byAddress.get(u.address);
      const relay = from && from.snap ? from.snap.info.downstreams.find((d) => d.uuid === to.uuid) : null;
      const last = to.linkErrors.get(u.address);
      out.push({ key: `${u.address}->${to.uuid}`, from, fromAddress: u.address, to, applier: u, relay,
                 stale: !to.up, lastError: last || null });
    }
  }
  return out;
}

function dedupe(recs) {
  const byKey = new Map();
  for (const r of recs) {
    const key = r.uuid || r.base;
    const prev = byKey.get(key);
    if (!prev || (!prev.up && r.up) || (!prev.snap && r.snap)) byKey.set(key, r);
  }
  return [...byKey.values()];
}

// Members first, by the id each gives itself, then anonymous replicas: the same order for rows
// (members) and columns (nodes), so each node's id for itself runs down the diagonal.
function byRole(a, b) {
  return (a.anon - b.anon) || ((a.ownId ?? 1e9) - (b.ownId ?? 1e9)) || portOf(a.address) - portOf(b.address) ||
    a.address.localeCompare(b.address);
}

function portOf(address) {
  return Number(address.slice(address.lastIndexOf(":") + 1)) || 0;
}

function labelOf(address, sameHost) {
  if (!address) return "?";
  return sameHost ? address.slice(address.lastIndexOf(":")) : address;
}

function clusterName(nodes) {
  const n = nodes.find((x) => x.snap);
  return n ? { name: n.snap.info.cluster_name, uuid: n.snap.info.cluster_uuid } : null;
}
