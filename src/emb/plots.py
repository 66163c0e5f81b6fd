"""Figures for the report (matplotlib, headless): data in, ``Figure`` out; :func:`save` writes.

Every function here is pure: it draws what it is given and reads no file, so the stages decide
what goes where and the figures can be tested on small arrays.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on clusters or CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.path import Path as MplPath  # noqa: E402
from shapely import point_on_surface  # noqa: E402
from shapely.geometry.polygon import orient  # noqa: E402

from emb.io import atomic_path  # noqa: E402

LEVELS = ("l1", "l2", "l3")
DPI = 110


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG bytes (what a page embeds inline), its memory released."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def save(fig: Figure, path: Path | str) -> Path:
    """Write ``fig`` as PNG atomically and release its memory."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def row_normalized(cm: np.ndarray) -> np.ndarray:
    """Each reference row divided by its support (NaN for a class absent from the reference)."""
    cm = np.asarray(cm, dtype=np.float64)
    support = cm.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, cm / support, np.nan)


def confusion_figure(cm: np.ndarray, names: tuple[str, ...] | list[str], title: str) -> Figure:
    """Row-normalized confusion matrix over the classes in the reference or the prediction.

    Classes that neither occur nor are predicted are left out (61 empty rows help nobody);
    rows of classes predicted but absent from the reference stay blank.
    """
    cm = np.asarray(cm)
    shown = np.flatnonzero((cm.sum(1) > 0) | (cm.sum(0) > 0))
    if shown.size == 0:
        shown = np.arange(cm.shape[0])
    sub = row_normalized(cm[np.ix_(shown, shown)])
    labels = [names[i] for i in shown]
    n = len(shown)
    side = max(4.0, 0.32 * n + 2.5)
    fig, ax = plt.subplots(figsize=(side + 1.2, side))
    image = ax.imshow(sub, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("reference")
    if n <= 15:
        for i in range(n):
            for j in range(n):
                if np.isfinite(sub[i, j]) and sub[i, j] >= 0.005:
                    colour = "white" if sub[i, j] > 0.6 else "black"
                    ax.text(j, i, f"{sub[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color=colour)  # fmt: skip
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of reference row")
    ax.set_title(title, fontsize=9)
    return fig


def iou_figure(per_class: pd.DataFrame, title: str) -> Figure:
    """Per-class IoU bars, one panel per level, classes present in the reference only.

    ``per_class``: rows of one weight set with columns level, class_name, support, iou.
    """
    present = per_class[per_class["support"] > 0]
    counts = [max(1, int((present["level"] == lv).sum())) for lv in LEVELS]
    fig, axes = plt.subplots(
        len(LEVELS), 1, figsize=(7, 1.2 + 0.26 * sum(counts)),
        gridspec_kw={"height_ratios": counts}, squeeze=False,
    )  # fmt: skip
    for ax, level in zip(axes[:, 0], LEVELS, strict=True):
        rows = present[present["level"] == level].sort_values("iou")
        xerr = _err(rows, "iou")
        ax.barh(rows["class_name"], rows["iou"], color="tab:blue", xerr=xerr, capsize=2)
        for y, (iou, support) in enumerate(zip(rows["iou"], rows["support"], strict=True)):
            ax.text(min(iou, 1.0) + 0.01, y, f"{iou:.2f} (n={support:,})", va="center", fontsize=7)
        ax.set_xlim(0, 1.25)
        ax.set_xticks(np.linspace(0, 1, 6))
        ax.set_ylabel(level.upper())
        ax.tick_params(axis="y", labelsize=8)
    ci = " ; bars: 95% block-bootstrap interval" if "iou_lo" in present else ""
    axes[-1, 0].set_xlabel(f"IoU (n = reference pixels){ci}")
    axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


LEVEL_COLOURS = {"l1": "tab:blue", "l2": "tab:orange", "l3": "tab:red"}
SET_STYLES = {"": "-", "ema": "--", "raw": ":"}


def curves_figure(history: pd.DataFrame, title: str) -> Figure:
    """Training curves from ``history.csv``: losses (total and per head, training and
    validation), validation mIoU per level and weight set, learning rate.

    Columns used where present: ``train_loss``, ``train_loss_l{1,2,3}``, ``val_loss`` or
    ``val_{ema,raw}_loss``, ``val_miou_l{1,2,3}`` or ``val_{ema,raw}_miou_l{1,2,3}``, ``lr``.
    Colour = level, line style = weight set (solid: the only one, dashed: EMA, dotted: raw).
    """
    x_col = "epoch" if "epoch" in history else "step"
    x = history[x_col]
    sets = [s for s in ("ema", "raw") if f"val_{s}_miou_l3" in history] or [""]

    def col(kind: str, weights: str, level: str = "") -> str:
        name = f"val_{weights}_{kind}" if weights else f"val_{kind}"
        return f"{name}_{level}" if level else name

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if "train_loss" in history:
        axes[0].plot(x, history["train_loss"], color="black", label="train (weighted sum)")
    for level, colour in LEVEL_COLOURS.items():
        if f"train_loss_{level}" in history:
            axes[0].plot(x, history[f"train_loss_{level}"], color=colour, label=f"train {level}")
    for weights in sets:
        if col("loss", weights) in history:
            axes[0].plot(x, history[col("loss", weights)], SET_STYLES[weights], color="grey",
                         label=f"val {weights}".strip())  # fmt: skip
        for level, colour in LEVEL_COLOURS.items():
            if col("miou", weights, level) in history:
                axes[1].plot(x, history[col("miou", weights, level)], SET_STYLES[weights],
                             color=colour, label=f"{level} {weights}".strip())  # fmt: skip
    axes[0].set_title("loss")
    axes[1].set_title("validation mIoU")
    axes[1].set_ylim(0, 1)
    if "lr" in history:
        axes[2].plot(x, history["lr"], color="tab:green", label="lr")
        axes[2].set_yscale("log")
    axes[2].set_title("learning rate")
    for ax in axes:
        ax.set_xlabel(x_col)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _err(rows: pd.DataFrame, column: str) -> np.ndarray | None:
    """(2, n) distances to the ``{column}_lo``/``_hi`` bounds for error bars; None without
    them (older metrics), and 0 where a bound is missing."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in rows or hi not in rows:
        return None
    v = rows[column].to_numpy(float)
    below = v - pd.to_numeric(rows[lo], errors="coerce").to_numpy(float)
    above = pd.to_numeric(rows[hi], errors="coerce").to_numpy(float) - v
    return np.nan_to_num(np.clip(np.stack([below, above]), 0, None))


def summary_figure(summary: pd.DataFrame) -> Figure:
    """All runs side by side: mIoU, macro-F1 and OA per level (grouped bars, one per run)."""
    figures = (("miou", "mIoU"), ("f1", "macro-F1"), ("oa", "overall accuracy"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    runs = list(summary["run"])
    width = 0.8 / max(len(runs), 1)
    for ax, (key, label) in zip(axes, figures, strict=True):
        for i, run in enumerate(runs):
            row = summary[summary["run"] == run].iloc[0]
            values = [row[f"{key}_{lv}"] for lv in LEVELS]
            pos = np.arange(len(LEVELS)) + (i - (len(runs) - 1) / 2) * width
            frame = pd.DataFrame(
                {
                    "v": row[f"{key}_{lv}"],
                    **{f"v_{e}": row.get(f"{key}_{lv}_{e}") for e in ("lo", "hi")},
                }
                for lv in LEVELS
            )
            bars = ax.bar(pos, values, width, label=run, yerr=_err(frame, "v"), capsize=2)
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_xticks(range(len(LEVELS)), [lv.upper() for lv in LEVELS])
        ax.set_title(label)
        ax.set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    ci = "; error bars: 95% block-bootstrap intervals" if any("_lo" in c for c in summary) else ""
    fig.suptitle(f"test split, all runs{ci}")
    fig.tight_layout()
    return fig


def data_figure(manifest: dict, l3_names: tuple[str, ...] | list[str]) -> Figure:
    """The data manifest: tiles kept and dropped per split, and the L3 class histogram
    (labelled pixels per split, classes present anywhere)."""
    splits = list(manifest["splits"])
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [1, 3]})
    tiles = [manifest["splits"][s]["samples"] for s in splits]
    dropped = [sum(manifest["splits"][s].get("dropped", {}).values()) for s in splits]
    bars = ax0.bar(splits, tiles, label="tiles")
    ax0.bar_label(bars)
    ax0.bar(splits, dropped, bottom=tiles, color="lightgrey", label="dropped")
    ax0.set_title(f"{manifest['source']}: tiles per split")
    ax0.legend(fontsize=8)
    hist = np.array([manifest["splits"][s]["class_hist"] for s in splits], dtype=np.float64)
    present = np.flatnonzero(hist.sum(0) > 0)
    order = present[np.argsort(-hist[:, present].sum(0))]
    height = 0.8 / max(len(splits), 1)
    for i, split in enumerate(splits):
        ax1.barh(np.arange(len(order)) + i * height, hist[i, order], height, label=split)
    ax1.set_yticks(np.arange(len(order)) + height, [l3_names[c] for c in order], fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("labelled pixels")
    ax1.set_title("L3 class histogram")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    return fig


def map_figure(
    l3: np.ndarray, colours: np.ndarray, names: tuple[str, ...] | list[str], title: str,
    nodata: int = 255,
) -> Figure:  # fmt: skip
    """A predicted L3 map, north up, in its class colours, with a legend of the classes shown.

    ``l3``: (H, W) uint8 ids as they lie on the ground (row 0 = north); ``colours``: (n, 3).
    """
    rgba = np.zeros((*l3.shape, 4), np.uint8)
    valid = l3 != nodata
    rgba[valid, :3] = colours[l3[valid]]
    rgba[valid, 3] = 255
    fig, ax = plt.subplots(figsize=(8, 6))
    ax.imshow(rgba, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ids, counts = np.unique(l3[valid], return_counts=True)
    order = ids[np.argsort(-counts)]
    handles = [Patch(color=colours[i] / 255.0, label=names[i]) for i in order]
    if (~valid).any():
        handles.append(Patch(facecolor="white", edgecolor="grey", label="nodata"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              title="L3 class")  # fmt: skip
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def html_page(title: str, tables: list[tuple[str, pd.DataFrame]], floatfmt: str = "{:.4f}") -> str:
    """A self-contained HTML page of titled tables (the report shows HTML inline, CSV not)."""
    style = (
        "body{font-family:sans-serif;font-size:13px}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}"
        "th{background:#f2f2f2}"
    )
    parts = [
        f"<h3>{html.escape(name)}</h3>"
        + table.to_html(index=False, float_format=floatfmt.format, na_rep="", border=0)
        for name, table in tables
    ]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )


VERDICT_COLOURS = {"distinguishable": "tab:red", "not distinguishable": "tab:blue"}


def forest_figure(pairs: pd.DataFrame, floor: int, figure: str = "miou") -> Figure:
    """Paired differences as a forest plot: one line per pair and level (``figure``'s rows of
    ``pairs.csv``), the difference and its interval, a vertical line at 0; a difference
    without an interval is a hollow point with the reason beside it, a pair that was not
    paired is its label and the reason.

    ``floor``: the fewest shared blocks an interval needs (named in the reason).
    """
    paired = pairs[pairs["figure"] == figure] if "figure" in pairs else pairs.iloc[:0]
    unpaired = pairs[pairs["level"].isna()] if "level" in pairs else pairs.iloc[:0]
    rows = list(paired.itertuples(index=False)) + list(unpaired.itertuples(index=False))
    n = max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(9, 1.3 + 0.34 * n))
    ax.axvline(0.0, color="black", linewidth=0.8)
    values = [v for r in rows for v in (r.difference, r.lo, r.hi) if pd.notna(v)]
    span = max([abs(v) for v in values] + [0.05]) * 1.15
    labels = []
    for y, r in enumerate(rows):
        if pd.isna(r.level):
            labels.append(r.pair)
            why = re.split(r" \(|: ", str(r.sentence).split(": not paired: ", 1)[-1])[0]
            ax.text(-span * 0.97, y, f"not paired: {why}", va="center", fontsize=7,
                    color="dimgrey")  # fmt: skip
            continue
        labels.append(f"{r.pair} {str(r.level).upper()}")
        if pd.notna(r.lo) and pd.notna(r.hi):
            colour = VERDICT_COLOURS.get(r.verdict, "tab:blue")
            ax.errorbar(r.difference, y, xerr=[[r.difference - r.lo], [r.hi - r.difference]],
                        fmt="o", color=colour, capsize=3, markersize=4)  # fmt: skip
        else:
            ax.plot(r.difference, y, "o", mfc="white", mec="dimgrey", markersize=5)
            ax.annotate(f"no interval: {int(r.blocks)} shared blocks (< {floor})",
                        (r.difference, y), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=7, color="dimgrey")  # fmt: skip
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # the first pair on top
    ax.set_xlim(-span, span)
    name = {"miou": "mIoU", "oa": "OA", "f1": "macro F1"}.get(figure, figure)
    ax.set_xlabel(f"{name} difference (b - a), 95% block-bootstrap interval")
    handles = [plt.Line2D([], [], marker="o", color=c, linestyle="", label=v)
               for v, c in VERDICT_COLOURS.items()]  # fmt: skip
    handles.append(plt.Line2D([], [], marker="o", mfc="white", mec="dimgrey", linestyle="",
                              label="no interval (too few blocks)"))  # fmt: skip
    ax.legend(handles=handles, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3,
              frameon=False)  # fmt: skip
    ax.set_title(f"Paired differences on the test split ({name})", fontsize=9, pad=20)
    fig.tight_layout()
    return fig


INTERVAL = re.compile(r"^([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]$")
PAGE_STYLE = (
    "body{font-family:sans-serif;font-size:13px;margin:12px 16px}"
    "table{border-collapse:collapse;margin-bottom:1.2em}"
    "th,td{padding:3px 7px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}"
    "th{background:#f2f2f2}td.num{text-align:right;white-space:nowrap}td.iv{text-align:right}"
    ".ci{white-space:nowrap;color:#555;font-size:12px}"
    "ul.caveats{max-width:1100px;padding-left:1.2em}"
    "img{max-width:100%;display:block;margin-bottom:0.8em}"
)


def _cell(value: object) -> str:
    """One cell: an interval cell "0.886 [0.848, 0.931]" may wrap before its bracket, never
    inside it; a number is right-aligned, text left-aligned."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "<td></td>"
    if isinstance(value, float):
        return f"<td class='num'>{value:.3f}</td>"
    text = str(value)
    found = INTERVAL.match(text)
    if found:
        v, lo, hi = found.groups()
        return f"<td class='iv'>{v} <span class='ci'>[{lo}, {hi}]</span></td>"
    if re.fullmatch(r"[+-]?\d+(\.\d+)?", text):
        return f"<td class='num'>{html.escape(text)}</td>"
    return f"<td>{html.escape(text)}</td>"


def html_table(frame: pd.DataFrame, table_id: str, grouped: bool = False) -> str:
    """``frame`` as an HTML table (id ``table_id``). ``grouped``: columns "mIoU L1", "mIoU L2",
    ... get one header "mIoU" over "L1", "L2", ... (a narrow table, no repeated names)."""
    cols = [str(c) for c in frame.columns]
    if grouped:
        parts = [c.rsplit(" ", 1) if re.search(r" L\d$", c) else [c, ""] for c in cols]
        top, sub = [], []
        for group, level in parts:
            if level and top and top[-1][0] == group and top[-1][2]:
                top[-1][1] += 1
            else:
                top.append([group, 1, bool(level)])
            if level:
                sub.append(level)
        first = "".join(
            f"<th colspan='{span}'>{html.escape(g)}</th>" if grouped_ else
            f"<th rowspan='2'>{html.escape(g)}</th>"
            for g, span, grouped_ in top
        )  # fmt: skip
        head = f"<tr>{first}</tr><tr>{''.join(f'<th>{s}</th>' for s in sub)}</tr>"
    else:
        head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"
    body = "".join(
        "<tr>" + "".join(_cell(v) for v in row) + "</tr>"
        for row in frame.itertuples(index=False, name=None)
    )
    return f"<table id='{table_id}'><thead>{head}</thead><tbody>{body}</tbody></table>"


def html_sections(title: str, sections: list[tuple[str, str]]) -> str:
    """A self-contained HTML page of titled sections, each already HTML."""
    parts = "".join(f"<h3>{html.escape(name)}</h3>{content}" for name, content in sections)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{PAGE_STYLE}</style></head><body><h2>{html.escape(title)}</h2>{parts}"
        "</body></html>\n"
    )


def area_figure(panels: list[tuple[str, pd.DataFrame]], title: str, level: str) -> Figure:
    """Each class's area as the map counts it and as estimated, with the estimate's interval at
    ``level`` (a label, e.g. ``95%``; and the CDL's area where the rows hold it, ``cdl_ha``): one
    panel per (title, rows), the rows one class each (``class``, ``mapped_ha``, ``estimated_ha``,
    ``lo_ha``, ``hi_ha``), the largest on top. A class without an interval is a hollow point."""
    fig, axes = plt.subplots(1, max(len(panels), 1), squeeze=False,
                             figsize=(6.5 * max(len(panels), 1), 1.4 + 0.32 * max(
                                 [len(rows) for _, rows in panels] + [1])))  # fmt: skip
    for ax, (name, rows) in zip(axes[0], panels, strict=False):
        y = np.arange(len(rows))
        est = rows["estimated_ha"].to_numpy(float)
        lo = pd.to_numeric(rows["lo_ha"], errors="coerce").to_numpy(float)
        hi = pd.to_numeric(rows["hi_ha"], errors="coerce").to_numpy(float)
        has = np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(est[has], y[has], xerr=np.clip([est[has] - lo[has], hi[has] - est[has]], 0,
                    None), fmt="o", color="tab:blue", capsize=3, markersize=4,
                    label=f"estimated, {level} interval")  # fmt: skip
        ax.plot(est[~has], y[~has], "o", mfc="white", mec="tab:blue", linestyle="",
                label="estimated, no standard error")  # fmt: skip
        ax.plot(rows["mapped_ha"].to_numpy(float), y, "s", color="tab:orange", markersize=4,
                linestyle="", label="map's pixel count")  # fmt: skip
        if "cdl_ha" in rows and rows["cdl_ha"].notna().any():
            ax.plot(pd.to_numeric(rows["cdl_ha"], errors="coerce").to_numpy(float), y, "x",
                    color="black", linestyle="", label="CDL (reference)")  # fmt: skip
        ax.set_yticks(y, list(rows["class"]), fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlabel("hectares")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _polygon_path(geometry: object) -> MplPath:
    """One compound path of a polygon or multipolygon, its holes wound against its shell so
    either fill rule leaves them empty."""
    parts = getattr(geometry, "geoms", [geometry])
    rings = []
    for part in parts:
        part = orient(part, 1.0)  # shell counter-clockwise, holes clockwise
        rings += [np.asarray(part.exterior.coords)[:, :2]]
        rings += [np.asarray(r.coords)[:, :2] for r in part.interiors]
    codes = [np.r_[MplPath.MOVETO, [MplPath.LINETO] * (len(r) - 2), MplPath.CLOSEPOLY]
             for r in rings]  # fmt: skip
    return MplPath(np.concatenate(rings), np.concatenate(codes).astype(np.uint8))


def district_figure(
    geometries: list | tuple, names: list[str] | tuple[str, ...], values: np.ndarray | list,
    title: str, label: str, geographic: bool = False,
) -> Figure:  # fmt: skip
    """A choropleth of districts: each polygon (shapely, any CRS; holes and multipolygons as
    they are) filled by its value (e.g. the headline class's estimated hectares), a colour bar
    saying ``label``, each district named at a point inside it. A district without a value
    (NaN: no map reaches it) is hatched grey, not coloured as 0. ``geographic``: coordinates
    are degrees, drawn with a degree of longitude shortened to its length at the mid
    latitude."""
    values = np.asarray(values, np.float64)
    paths = [_polygon_path(g) for g in geometries]
    known = np.isfinite(values)
    norm = Normalize(*(np.nanmin(values), np.nanmax(values)) if known.any() else (0.0, 1.0))
    fig, ax = plt.subplots(figsize=(7.5, 6))
    shaded = PathCollection([p for p, k in zip(paths, known, strict=True) if k], cmap="YlGn",
                            norm=norm, edgecolor="black", linewidth=0.6)  # fmt: skip
    shaded.set_array(values[known])
    ax.add_collection(shaded)
    if (~known).any():
        ax.add_collection(PathCollection(
            [p for p, k in zip(paths, known, strict=True) if not k], facecolor="lightgrey",
            edgecolor="black", linewidth=0.6, hatch="//"))  # fmt: skip
        gap = Patch(facecolor="lightgrey", edgecolor="black", hatch="//", label="no estimate")
        ax.legend(handles=[gap], loc="upper left", bbox_to_anchor=(0.0, 0.0), fontsize=8)
    for geometry, name in zip(geometries, names, strict=True):
        at = point_on_surface(geometry)
        box = {"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.7, "lw": 0}
        ax.annotate(str(name), (at.x, at.y), ha="center", va="center", fontsize=8, bbox=box)
    ax.autoscale_view()
    if geographic:
        mid = np.mean(ax.get_ylim())
        ax.set_aspect(1.0 / max(np.cos(np.radians(mid)), 1e-6))
    else:
        ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(shaded, ax=ax, label=label, shrink=0.8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
