"""Progress plots: one PNG per node, each origin's lsn on that node over time.

Input is the small list of points spark.jobs collects from pass 2 (node, origin, seconds, lsn);
nothing here touches Spark. Figures are matplotlib's objects on its file-only Agg canvas, never
pyplot's global state: the driver draws them in a thread of its own while the last Spark stage
runs (spark.analyze)."""
from __future__ import annotations

import os
from collections import defaultdict

from matplotlib.figure import Figure


def draw(points: list[tuple[str, str, float, int]], out_dir: str,
         node_dirs: dict[str, str] | None = None) -> list[str]:
    """Write progress-<node uuid>.png for every node in points; returns the paths."""
    node_dirs = node_dirs or {}
    by_node: dict[str, dict[str, list[tuple[float, int]]]] = defaultdict(lambda: defaultdict(list))
    for node, origin, t, lsn in points:
        by_node[node][origin].append((t, lsn))
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for node in sorted(by_node):
        # Fixed margins, not tight_layout (which draws the figure once more); fast zlib level:
        # the PNGs are a few flat lines, and drawing them was ~1 s of a ~13 s run.
        fig = Figure(figsize=(9, 5), dpi=100)
        ax = fig.subplots()
        fig.subplots_adjust(left=0.09, right=0.98, top=0.93, bottom=0.1)
        for origin in sorted(by_node[node]):
            pts = sorted(by_node[node][origin])
            label = origin[:8] + (" (self)" if origin == node else "")
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=label, linewidth=1.2)
        where = f" ({node_dirs[node]})" if node in node_dirs else ""
        ax.set_title(f"node {node}{where}: rows applied per origin", fontsize="medium")
        ax.set_xlabel("seconds since the first frame of any node")
        ax.set_ylabel("origin lsn")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", title="origin")
        path = os.path.join(out_dir, f"progress-{node}.png")
        fig.savefig(path, pil_kwargs={"compress_level": 1})
        written.append(path)
    return written
