"""The one plotting style of every figure: sizes, fonts, colours, names, saving, layout check.

Figures are drawn at their printed size (one column = 3.3 in wide), so a 7 pt label in
the PNG is a 7 pt label on paper. Colours are the Okabe-Ito palette (safe for colour-blind
readers and in greyscale with the markers). Every system, tier and policy has one colour
and one marker in every figure.
"""
from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.text  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

COLUMN_WIDTH_IN = 3.3
PNG_DPI = 300

_OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
LIMIT_COLOR = "#555555"

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 7.5,
    "axes.labelsize": 7.5,
    "axes.titlesize": 7.5,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6.5,
    "legend.frameon": False,
    "legend.handlelength": 1.8,
    "legend.columnspacing": 1.0,
    "axes.linewidth": 0.6,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.minor.width": 0.4,
    "ytick.minor.width": 0.4,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,  # embed TrueType: text stays text in the PDF
    "savefig.bbox": "standard",
    "svg.hashsalt": "cascade",
}

# name -> (label, colour, marker); one entry per thing that is ever plotted
SERIES: dict[str, tuple[str, str, str]] = {
    # systems (benchmark.adapters names)
    "cascade": ("Cascade", _OKABE_ITO[0], "o"),
    "cascade_file": ("Cascade (file tier)", _OKABE_ITO[5], "o"),
    "lmcache_cpu": ("LMCache CPU", _OKABE_ITO[1], "s"),
    "lmcache_disk": ("LMCache disk", _OKABE_ITO[4], "p"),
    "lmcache_disk_odirect": ("LMCache disk, O_DIRECT", _OKABE_ITO[4], "P"),  # a variant: its family's colour
    "lmcache_cpu_disk": ("LMCache CPU+disk", _OKABE_ITO[3], "h"),
    "redis": ("Redis", _OKABE_ITO[2], "^"),
    "redis_unix": ("Redis (Unix socket)", _OKABE_ITO[2], "<"),
    "hdf5": ("HDF5", _OKABE_ITO[7], "v"),
    "hdf5_nocache": ("HDF5, no chunk cache", _OKABE_ITO[7], "1"),
    "mooncake": ("Mooncake Store", _OKABE_ITO[6], "D"),
    "pdc": ("PDC", "#999999", "x"),
    # tiers
    "gpu": ("GPU tier (numpy)", _OKABE_ITO[3], "D"),
    "shm": ("SHM tier", _OKABE_ITO[0], "o"),
    "remote": ("REMOTE tier", _OKABE_ITO[2], "^"),
    "lustre": ("LUSTRE tier", _OKABE_ITO[1], "s"),
    "cluster": ("another rank", _OKABE_ITO[4], "v"),
    "store_put_hashed": ("store put + BLAKE3", _OKABE_ITO[5], "x"),
    # policies
    "reference_lru": ("LRU (reference)", "#777777", "None"),
    "reference_belady": ("Belady (optimal)", "#000000", "None"),
    "cascade_semantic": ("Cascade, semantic", _OKABE_ITO[0], "o"),
    "cascade_lru": ("Cascade, LRU", _OKABE_ITO[0], "s"),  # Cascade's colour: same store, other policy
}
_extra_colors = itertools.cycle(_OKABE_ITO[4:])


def series(name: str) -> tuple[str, str, str]:
    """(label, colour, marker) of ``name``; an unknown name gets its own as label."""
    if name not in SERIES:
        SERIES[name] = (name, next(_extra_colors), "o")
    return SERIES[name]


def label(name: str) -> str:
    return series(name)[0]


def apply() -> None:
    """Install the style (idempotent)."""
    plt.rcParams.update(RC)


def figure(height_in: float, ncols: int = 1, nrows: int = 1, *, width_in: float = COLUMN_WIDTH_IN,
           sharey: bool = False, sharex: bool = False, **kw: Any) -> tuple[Figure, Any]:
    """A column-wide figure of ``height_in`` inches with a grid of axes."""
    apply()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), sharey=sharey, sharex=sharex, **kw)
    return fig, axes


def size_label(nbytes: float) -> str:
    """``65536`` -> ``'64K'``, ``4194304`` -> ``'4M'`` (binary units, for tick labels)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}"


#: Sizes closer than this many octaves to the last labelled one keep their tick, unlabelled
#: (1M and 2M would overlap at column width).
MIN_LABEL_OCTAVES = 1.5


def bytes_axis(ax, sizes: list[int]) -> None:
    """A log2 x axis ticked at exactly the measured block sizes; a label is left off a
    tick within :data:`MIN_LABEL_OCTAVES` of the previous labelled one."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    labels, last = [], None
    for s in sizes:
        keep = last is None or abs(math.log2(s / last)) >= MIN_LABEL_OCTAVES
        labels.append(size_label(s) if keep else "")
        last = s if keep else last
    ax.set_xticklabels(labels)
    ax.minorticks_off()


def whiskers(ax, xs: list[float], ys: list[Any], color: str = "black", *, cap: float | None = None) -> int:
    """Min-max error bars over the repetitions of a suite run, at every point whose value
    is a :class:`~paper.spread.Spread` (plain numbers, equal in every repetition, get
    none). Drawn as lines so that axis limits computed from ``ax.get_lines()`` include them.
    ``cap``: half-width of the caps in x data units (bars); None: marker caps (lines).
    Returns the number of bars drawn."""
    from .spread import Spread

    drawn = 0
    for x, y in zip(xs, ys):
        if not isinstance(y, Spread) or not y.varies:
            continue
        kw = {"color": color, "lw": 0.7, "zorder": 4}
        if cap is None:
            ax.plot([x, x], [y.lo, y.hi], marker="_", markersize=3.5, markeredgewidth=0.7, **kw)
        else:
            ax.plot([x, x], [y.lo, y.hi], **kw)
            ax.plot([x - cap, x + cap], [y.lo, y.lo], **kw)
            ax.plot([x - cap, x + cap], [y.hi, y.hi], **kw)
        drawn += 1
    return drawn


def legend_below(fig: Figure, handles: list, *, ncol: int = 2, axis_room_in: float = 0.42) -> float:
    """A figure legend along the bottom edge; returns the ``bottom`` to give
    ``subplots_adjust`` so the axes, their tick labels and x label (``axis_room_in``
    inches) sit just above it."""
    legend = fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol)
    fig.canvas.draw()
    height = legend.get_window_extent(fig.canvas.get_renderer()).height / fig.bbox.height
    return height + axis_room_in / fig.get_figheight()


def save(fig: Figure, directory: Path, name: str) -> list[Path]:
    """Write ``name.pdf`` and ``name.png`` into ``directory`` (atomically: through
    ``*.tmp`` then rename) with fixed metadata, so equal inputs give equal PDFs."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for ext, kw in (("pdf", {"metadata": {"CreationDate": None, "ModDate": None, "Producer": None}}),
                    ("png", {"dpi": PNG_DPI, "metadata": {"Software": None}})):
        final = directory / f"{name}.{ext}"
        tmp = directory / f"{name}.{ext}.tmp"
        fig.savefig(tmp, format=ext, **kw)
        os.replace(tmp, final)
        written.append(final)
    plt.close(fig)
    return written


def drawn_texts(fig: Figure) -> list[matplotlib.text.Text]:
    """The texts a draw of ``fig`` really renders (tick labels outside the view limits,
    empty and invisible texts are not drawn, so they are left out)."""
    drawn: dict[int, matplotlib.text.Text] = {}
    original = matplotlib.text.Text.draw

    def spy(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self
        return original(self, renderer)

    matplotlib.text.Text.draw = spy
    try:
        fig.canvas.draw()
    finally:
        matplotlib.text.Text.draw = original
    return list(drawn.values())


def _outline(t: matplotlib.text.Text, renderer) -> list[tuple[float, float]]:
    """Corners of a drawn text's box in display pixels: its bounding box, or for text
    rotated about its anchor (``rotation_mode="anchor"``, e.g. slanted tick labels) the
    rotated rectangle itself, so neighbours whose boxes only touch at the corners pass."""
    box = t.get_window_extent(renderer)
    angle = t.get_rotation() % 360
    if angle % 90 == 0 or t.get_rotation_mode() != "anchor":
        return [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    t.set_rotation(0)
    try:
        flat = t.get_window_extent(renderer)
    finally:
        t.set_rotation(angle)
    ax, ay = t.get_transform().transform(t.get_unitless_position())
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    corners = [(flat.x0, flat.y0), (flat.x1, flat.y0), (flat.x1, flat.y1), (flat.x0, flat.y1)]
    return [(ax + c * (x - ax) - s * (y - ay), ay + s * (x - ax) + c * (y - ay)) for x, y in corners]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]], slack: float = 1.0) -> bool:
    """Whether two convex outlines overlap by more than ``slack`` pixels (separating axes)."""
    for poly in (a, b):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            norm = math.hypot(nx, ny) or 1.0
            pa = [(nx * x + ny * y) / norm for x, y in a]
            pb = [(nx * x + ny * y) / norm for x, y in b]
            if max(pa) <= min(pb) + slack or max(pb) <= min(pa) + slack:
                return False
    return True


def layout_problems(fig: Figure) -> list[str]:
    """Texts that overlap each other or stick out of the figure (empty when clean).

    Checks every drawn text (tick labels, axis labels, titles, legend entries,
    annotations) by its rendered outline, with 1 px of tolerance."""
    texts = drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    outlines = [(t.get_text(), _outline(t, renderer)) for t in texts]
    problems = []
    for text, poly in outlines:
        xs, ys = [p[0] for p in poly], [p[1] for p in poly]
        if min(xs) < box.x0 - 1 or min(ys) < box.y0 - 1 or max(xs) > box.x1 + 1 or max(ys) > box.y1 + 1:
            problems.append(f"text {text!r} extends outside the figure")
    for (a, pa), (b, pb) in itertools.combinations(outlines, 2):
        if _overlap(pa, pb):
            problems.append(f"texts {a!r} and {b!r} overlap")
    return problems
