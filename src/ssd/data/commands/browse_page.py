"""The HTML of ``ssd data browse``: one self-contained page (thumbnails embedded as JPEG data URLs, boxes drawn as
SVG over them, histograms as SVG bars, no file or network fetched). Its script counts what it shows into
``#browse-ready`` (the browser test looks for it) and filters the thumbnails by class."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Thumb", "render_page", "histogram"]

_PALETTE = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#46f0f0", "#f032e6", "#bcf60c", "#008080",
            "#9a6324", "#800000", "#808000", "#000075", "#808080")
_STYLE = """body{font-family:sans-serif;margin:1em}figure{display:inline-block;margin:4px;vertical-align:top;
width:200px}figure.flagged{outline:3px solid #e6194b}.pic{position:relative}.pic img,.pic svg{display:block;width:100%;
height:auto}.pic svg{position:absolute;left:0;top:0;height:100%}figcaption{font-size:11px;word-break:break-all}
.issue{color:#b00}table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}
.bar{background:#4363d8;height:10px;display:inline-block}.hidden{display:none}"""
_SCRIPT = """
const shown=()=>document.querySelectorAll('figure.thumb:not(.hidden)').length;
document.getElementById('class-filter').addEventListener('change',e=>{const v=e.target.value;
 document.querySelectorAll('figure.thumb').forEach(f=>{const c=JSON.parse(f.dataset.classes);
  f.classList.toggle('hidden',v!=='*'&&!c.includes(v));});});
const ready=document.createElement('p');ready.id='browse-ready';
ready.textContent=`${shown()} thumbnails, ${document.querySelectorAll('figure.flagged').length} flagged, `+
 `${document.querySelectorAll('svg rect.box').length} boxes, ${document.querySelectorAll('figure.batch').length} `+
 'augmented images';document.body.appendChild(ready);
"""


@dataclass
class Thumb:
    """One picture: its JPEG data URL, its pixel size (the boxes' frame), caption, boxes ``(x1, y1, x2, y2, label)``
    in that frame, and the check's messages about it (a flagged image)."""

    src: str
    width: int
    height: int
    caption: str
    boxes: list[tuple[float, float, float, float, int]] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)


def histogram(values: Sequence[float], lo: float, hi: float, bins: int) -> list[int]:
    """Counts of ``values`` in ``bins`` equal bins over ``[lo, hi]`` (values outside go to the end bins)."""
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - lo) / (hi - lo) * bins)))] += 1
    return counts


def _svg_histogram(title: str, counts: list[int], lo: float, hi: float, unit: str) -> str:
    width, height, top = 400, 120, max(counts, default=0) or 1
    step = width / len(counts)
    bars = "".join(f'<rect x="{i * step:.1f}" y="{height - c / top * height:.1f}" width="{step - 1:.1f}" '
                   f'height="{c / top * height:.1f}" fill="#4363d8"><title>{lo + i * (hi - lo) / len(counts):.2f}'
                   f"..{lo + (i + 1) * (hi - lo) / len(counts):.2f}{unit}: {c}</title></rect>"
                   for i, c in enumerate(counts))
    return (f'<h3>{html.escape(title)}</h3><svg class="histogram" width="{width}" height="{height + 16}" '
            f'viewBox="0 0 {width} {height + 16}">{bars}<text x="0" y="{height + 14}" font-size="11">{lo:g}{unit}'
            f'</text><text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">{hi:g}{unit}</text></svg>')


def _figure(thumb: Thumb, names: Sequence[str], kind: str) -> str:
    rects = "".join(
        f'<rect class="box" x="{x1:.1f}" y="{y1:.1f}" width="{x2 - x1:.1f}" height="{y2 - y1:.1f}" fill="none" '
        f'stroke="{_PALETTE[k % len(_PALETTE)]}" stroke-width="{max(thumb.width, thumb.height) / 150:.2f}">'
        f"<title>{html.escape(names[k] if 0 <= k < len(names) else str(k))}</title></rect>"
        for x1, y1, x2, y2, k in thumb.boxes)
    classes = sorted({names[k] for *_, k in thumb.boxes if 0 <= k < len(names)})
    issues = "".join(f'<div class="issue">{html.escape(m)}</div>' for m in thumb.issues)
    flagged = " flagged" if thumb.issues else ""
    return (f'<figure class="{kind}{flagged}" data-classes="{html.escape(json.dumps(classes))}"><div class="pic">'
            f'<img src="{thumb.src}" alt="{html.escape(thumb.caption)}"><svg viewBox="0 0 {thumb.width} '
            f'{thumb.height}" preserveAspectRatio="none">{rects}</svg></div><figcaption>'
            f"{html.escape(thumb.caption)}{issues}</figcaption></figure>")


def render_page(title: str, summary: str, names: Sequence[str], counts: Sequence[tuple[int, int]],
                sizes: list[int], aspects: list[int], thumbs: Sequence[Thumb], batches: Sequence[Thumb]) -> str:
    """The page: ``counts[k]`` is class k's ``(objects, images)``; ``sizes`` / ``aspects`` histogram counts of box
    side (sqrt of the area share of the image, 0..1) and log2 aspect ratio (w/h, -4..4); thumbnails (flagged ones
    first, as given); ``batches``: augmented training images (a section only when given)."""
    top = max((c for c, _ in counts), default=0) or 1
    rows = "".join(f'<tr><td>{html.escape(n)}</td><td>{c}</td><td>{i}</td><td><span class="bar" '
                   f'style="width:{200 * c / top:.0f}px"></span></td></tr>' for n, (c, i) in zip(names, counts))
    options = "".join(f'<option value="{html.escape(n)}">{html.escape(n)}</option>' for n in names)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>",
             f'<section id="classes"><h2>Classes</h2><table><tr><th>class</th><th>objects</th><th>images</th><th>'
             f"</th></tr>{rows}</table></section>",
             '<section id="sizes"><h2>Boxes</h2>' + _svg_histogram("box side (sqrt of its share of the image)", sizes,
                                                                   0, 1, "") +
             _svg_histogram("aspect ratio (log2 of width / height)", aspects, -4, 4, "") + "</section>",
             f'<section id="images"><h2>Images (flagged first)</h2><label>class <select id="class-filter">'
             f'<option value="*">all</option>{options}</select></label><div>'
             + "".join(_figure(t, names, "thumb") for t in thumbs) + "</div></section>"]
    if batches:
        parts.append('<section id="augmented"><h2>Training batches as the trainer builds them</h2><div>'
                     + "".join(_figure(t, names, "batch") for t in batches) + "</div></section>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)
