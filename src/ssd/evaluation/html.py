"""``report.html``: one self-contained page of an evaluation report (inline CSS and script, images as files next
to it, no server, no network). The script makes tables sortable and the gallery filterable, then adds an element
``#report-ready`` (the browser test looks for it)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_report_html"]

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#eee;cursor:pointer}td:first-child,th:first-child{text-align:left}.absent{color:#999}
img.figure{max-width:100%;border:1px solid #ddd;margin:.3em 0}.advice{background:#fff4d6;padding:.5em}
#gallery figure{display:inline-block;width:420px;margin:.4em;vertical-align:top}
#gallery img{width:100%}figcaption{font-size:.85em}.hidden{display:none!important}
"""

_SCRIPT = """
function cellValue(row, i){const t=row.cells[i].dataset.value ?? row.cells[i].textContent;
  const n=parseFloat(t);return isNaN(n)?t:n;}
document.querySelectorAll('table.sortable').forEach(table=>{
  table.querySelectorAll('th').forEach((th,i)=>th.addEventListener('click',()=>{
    const body=table.tBodies[0];const rows=[...body.rows];const up=th.dataset.order!=='asc';
    rows.sort((a,b)=>{const x=cellValue(a,i),y=cellValue(b,i);return (x>y?1:x<y?-1:0)*(up?1:-1);});
    th.dataset.order=up?'asc':'desc';rows.forEach(r=>body.appendChild(r));}));});
function filterGallery(){const c=document.getElementById('class-filter').value;
  const e=document.getElementById('error-filter').value;
  document.querySelectorAll('#gallery figure').forEach(f=>{
    const ok=(!c||JSON.parse(f.dataset.classes).includes(c))&&(!e||JSON.parse(f.dataset.errors).includes(e));
    f.classList.toggle('hidden',!ok);});}
['class-filter','error-filter'].forEach(id=>{const s=document.getElementById(id);
  if(s)s.addEventListener('change',filterGallery);});
const ready=document.createElement('div');ready.id='report-ready';ready.className='hidden';
ready.textContent=document.querySelectorAll('table').length+' tables, '+document.images.length+' images';
document.body.appendChild(ready);
"""


def _number(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], sortable: bool = True,
           row_classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for index, row in enumerate(rows):
        cells = "".join(f"<td>{html.escape(_number(v))}</td>" for v in row)
        css = f' class="{row_classes[index]}"' if row_classes and row_classes[index] else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return (f'<table class="{"sortable" if sortable else ""}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _figures(figures: Sequence[tuple[str, str]]) -> str:
    return "".join(f'<h3>{html.escape(title)}</h3><img class="figure" src="{html.escape(path)}" '
                   f'alt="{html.escape(title)}">' for title, path in figures)


def _gallery(items: Sequence[Mapping[str, Any]], class_names: Sequence[str], kinds: Sequence[str]) -> str:
    def select(id_: str, label: str, options: Sequence[str]) -> str:
        opts = "".join(f'<option value="{html.escape(o)}">{html.escape(o)}</option>' for o in options)
        return f'<label>{label} <select id="{id_}"><option value="">all</option>{opts}</select></label> '

    figures = "".join(
        f'<figure data-classes="{html.escape(json.dumps(item["classes"]))}" '
        f'data-errors="{html.escape(json.dumps(item["errors"]))}"><img src="{html.escape(item["file"])}" '
        f'alt="{html.escape(item["caption"])}"><figcaption>{html.escape(item["caption"])}</figcaption></figure>'
        for item in items)
    return (select("class-filter", "class", class_names) + select("error-filter", "error", kinds)
            + f'<div id="gallery">{figures}</div>')


def _sources(sources: Mapping[str, Any] | None) -> list[str]:
    """The table of where the missed and poorly localized objects are (size buckets, default-box coverage)."""
    if not sources:
        return []
    buckets = [b["name"] for b in sources["missed"]["by_size"]]
    rows = [[name, group["count"], *(f"{b['share']:.0%}" for b in group["by_size"]),
             "-" if group["uncovered"] is None else f"{group['uncovered']:.0%}"] for name, group in sources.items()]
    return ["<h3>Where the missed and poorly localized objects are</h3>",
            _table(["objects", "count", *buckets, "no default box at IoU 0.5"], rows, sortable=False)]


def render_report_html(report: Mapping[str, Any], figures: Sequence[tuple[str, str]],
                       gallery: Sequence[Mapping[str, Any]], kinds: Sequence[str]) -> str:
    """The page of ``report`` (:func:`ssd.evaluation.report.build_report`), ``figures`` ``(title, relative path)``
    and ``gallery`` items ``dict(file, caption, classes, errors)``; ``kinds``: the error kinds to filter by."""
    names = report["class_names"]
    coco, point, errors = report["coco"], report["operating_point"], report["errors"]
    best = point["overall"]["best"]
    summary = [["images", report["num_images"]], ["objects", report["num_objects"]],
               ["VOC07 mAP@0.5", report["voc07"]["map"]], ["VOC mAP@0.5", report["voc"]["map"]],
               ["COCO AP@[.5:.95]", coco["AP"]],
               ["best F1 confidence", None if best is None else best["confidence"]],
               ["precision / recall / F1 there", "-" if best is None else
                f"{best['precision']:.3f} / {best['recall']:.3f} / {best['f1']:.3f}"]]
    per_class, row_classes = [], []
    for name in names:
        c, p = coco["per_class"][name], point["per_class"][name]
        if c["num_gt"] == 0:
            per_class.append([name, 0, c["num_det"], "absent", "absent", "absent", "-", "-", "-", "-"])
            row_classes.append("absent")
            continue
        b = p["best"]
        per_class.append([name, c["num_gt"], c["num_det"], c["ap50"], c["ap75"], c["ap"], b["confidence"],
                          b["precision"], b["recall"], b["f1"]])
        row_classes.append("")
    sections = [
        "<h2>Summary</h2>", _table(["", "value"], summary, sortable=False),
        *(f'<p class="advice">{html.escape(a)}</p>' for a in report["advice"]),
        "<h2>COCO statistics</h2>", _table(list(coco["stats"]), [list(coco["stats"].values())], sortable=False),
        "<h2>Per class</h2>",
        _table(["class", "objects", "detections", "AP50", "AP75", "AP50-95", "best conf", "P", "R", "F1"],
               per_class, row_classes=row_classes),
    ]
    if coco["by_size"]:
        sections += ["<h2>Per object size</h2>", _table(["size", "objects", "AP50-95", "AP50", "AR100"],
                                                        [[b["name"], b["num_gt"], b["AP"], b["AP50"], b["AR100"]]
                                                         for b in coco["by_size"]])]
    sections += ["<h2>Error breakdown (TIDE)</h2>",
                 _table(["error", "count", "dAP (mAP points)"],
                        [[k, v["count"], 100 * v["dap"]] for k, v in errors["errors"].items()]),
                 *_sources(report["error_sources"]),
                 "<h2>Figures</h2>", _figures(figures),
                 "<h2>Worst images</h2>", _gallery(gallery, names, kinds)]
    title = html.escape(f"ssd val: {report['data']} ({report['split']})")
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style></head>'
            f'<body><h1>{title}</h1>{"".join(sections)}<script>{_SCRIPT}</script></body></html>')
