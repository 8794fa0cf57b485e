"""PNG plots of a sweep: busbw vs message size, one file per op, one line per preset (matplotlib,
Agg)."""

from __future__ import annotations

import os


def _size_label(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def plot_busbw(rows: list[dict], out_dir: str) -> list[str]:
    """-> the PNG paths written (plots/busbw_<op>.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for op in dict.fromkeys(r["op"] for r in rows):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
        sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
        for preset in dict.fromkeys(r["preset"] for r in rows):
            pts = sorted(
                (r["bytes"], r["busbw_gbps"])
                for r in rows
                if r["op"] == op and r["preset"] == preset
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o",
                    markersize=3,
                    label=preset,
                    linewidth=1.5 if preset == "default" else 1.2,
                    linestyle="--" if preset == "default" else "-",
                )
        first = next(r for r in rows if r["op"] == op)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([_size_label(s) for s in sizes], rotation=45, fontsize=7)
        ax.set_xlabel("message size (bytes, per rank)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{op}: busbw vs size ({first.get('backend') or '?'}, {first['ranks']} ranks)")
        ax.grid(True, alpha=0.3)
        ax.legend(title="preset", fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"busbw_{op}.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
