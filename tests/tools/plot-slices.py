#!/usr/bin/env python3
"""Plot a timeline of `cuslice status --json` snapshots as an SVG (standard library only).

Usage: python3 tests/tools/plot-slices.py TIMELINE.jsonl OUT.svg [--title TEXT]

TIMELINE.jsonl holds one snapshot per line, as printed by `cuslice status --json`:

    {"time": 1763800000.25,                      # unix seconds
     "devices": [{"uuid": "GPU-...", "name": "...", "memory_total": 8589934592,
                  "slices": [{"slice": "ab12cd34ef56", "name": "demo-a",   # name may be null
                              "memory": {"used": ..., "limit": ... or null, "refusals": 1},
                              "compute": {"request_pct": ..., "limit_pct": ...,
                                          "share_1s_pct": ...}}]}]}

Any field except "time" may be null, extra fields are ignored. A slice is identified by (device
uuid, "slice") and labelled by its name (its id when the name is null), plus " (GPUn)" when the
file has more than one device, and coloured by that label (the same name gets the same colour in
every picture). Slices may come and go: their lines break where they are absent.

The picture has two panels over a shared time axis (seconds since the first snapshot): memory
held per slice (GiB) with each cap dashed and a red x wherever the slice's refusal count grew,
and compute share per slice (% of the device, 1 s window) with each limit dashed and each
request dotted. Any bad line is an error (exit 2), except trailing empty lines.
"""
import argparse
import json
import math
import sys
import zlib
from xml.sax.saxutils import escape

W, H = 900, 620
LEFT, RIGHT, BOTTOM = 70, 110, 50
GIB = 1024 ** 3
# Ordered so that the demo's trainer, notebook and batch (hashing to 0, 3 and 4) get blue, orange
# and green.
PALETTE = ["#1f77b4", "#9467bd", "#8c564b", "#ff7f0e", "#2ca02c", "#e377c2", "#17becf", "#7f7f7f"]
REFUSED = "#d62728"  # kept out of the palette so the refusal markers stand out
EXPECTED = "expected one `cuslice status --json` object per line"


class InputError(Exception):
    pass


# ---------------------------------------------------------------- input

def number(obj, key, where):
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError(f'{where}: expected a number or null for "{key}", got {json.dumps(v)[:40]}')
    return float(v)


def member(obj, key, kind, where):
    v = obj.get(key)
    if v is None:
        return kind()
    if not isinstance(v, kind):
        raise InputError(f'{where}: expected {"a list" if kind is list else "an object"} or null '
                         f'for "{key}", got {json.dumps(v)[:40]}')
    return v


def parse_snapshot(obj, where):
    """One line -> {"time": t, "totals": {uuid: bytes}, "slices": {(uuid, id): info}}."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    t = number(obj, "time", where)
    if t is None:
        raise InputError(f'{where}: expected a numeric "time" (unix seconds)')
    snap = {"time": t, "totals": {}, "slices": {}}
    for i, dev in enumerate(member(obj, "devices", list, where)):
        w = f"{where}: devices[{i}]"
        if not isinstance(dev, dict):
            raise InputError(f"{w}: expected an object")
        uuid = str(dev.get("uuid") or f"device {i}")
        snap["totals"][uuid] = number(dev, "memory_total", w)
        for j, s in enumerate(member(dev, "slices", list, w)):
            ws = f"{w}.slices[{j}]"
            if not isinstance(s, dict) or not (s.get("slice") or s.get("name")):
                raise InputError(f'{ws}: expected an object with a "slice" id')
            sid = str(s.get("slice") or s.get("name"))
            if (uuid, sid) in snap["slices"]:
                raise InputError(f"{ws}: slice {sid} appears twice on device {uuid}")
            mem = member(s, "memory", dict, ws)
            comp = member(s, "compute", dict, ws)
            snap["slices"][(uuid, sid)] = {
                "name": str(s.get("name") or sid),
                "used": number(mem, "used", ws + ".memory"),
                "limit": number(mem, "limit", ws + ".memory"),
                "refusals": number(mem, "refusals", ws + ".memory"),
                "share": number(comp, "share_1s_pct", ws + ".compute"),
                "limit_pct": number(comp, "limit_pct", ws + ".compute"),
                "request_pct": number(comp, "request_pct", ws + ".compute"),
            }
    return snap


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e}); expected a JSONL file with one `cuslice status --json` object per line") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; {EXPECTED}") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(f"{path}: no snapshots; {EXPECTED}")
    snaps = []
    for n, line in enumerate(lines, 1):
        where = f"{path}:{n}"
        if not line.strip():
            raise InputError(f"{where}: empty line; {EXPECTED}")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); {EXPECTED}") from None
        snaps.append(parse_snapshot(obj, where))
    snaps.sort(key=lambda s: s["time"])
    return snaps


def colours(labels):
    """A colour per label, chosen by the label itself, so a container keeps its colour from run
    to run whatever order the slices appear in: the palette entry its name hashes to (CRC-32),
    or the next free one when an earlier label (in sorted order) took it."""
    taken, out = set(), {}
    for label in sorted(labels):
        k = zlib.crc32(label.encode("utf-8")) % len(PALETTE)
        for step in range(len(PALETTE)):
            if (k + step) % len(PALETTE) not in taken:
                k = (k + step) % len(PALETTE)
                break
        taken.add(k)
        if len(taken) == len(PALETTE):
            taken.clear()
        out[label] = PALETTE[k]
    return out


def collect(snaps):
    """Per slice, sorted by label: label, colour and one row (info or None) per snapshot."""
    devices, names = {}, {}
    for s in snaps:
        for uuid in s["totals"]:
            devices.setdefault(uuid, len(devices))
        for key, info in s["slices"].items():
            devices.setdefault(key[0], len(devices))
            names.setdefault(key, info["name"])
    labelled = []
    for key, name in names.items():
        suffix = f" (GPU{devices[key[0]]})" if len(devices) > 1 else ""
        labelled.append((name + suffix, key))
    labelled.sort()
    colour = colours([label for label, _ in labelled])
    return [{"label": label, "color": colour[label], "rows": [s["slices"].get(key) for s in snaps]}
            for label, key in labelled]


# ---------------------------------------------------------------- scales and text

class Scale:
    def __init__(self, d0, d1, r0, r1):
        self.d0, self.d1, self.r0, self.r1 = d0, d1, r0, r1

    def __call__(self, v):
        return self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)


def nice_step(span, target):
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)


def tick_values(top, step):
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def fmt(v):
    return f"{v:.2f}".rstrip("0").rstrip(".")


def xml(text):
    text = "".join(c if c >= " " or c in "\t\n" else "?" for c in str(text))
    return escape(text, {'"': "&quot;"})


def text(x, y, s, size=12, anchor="start", color="#222", extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}"{extra}>{xml(s)}</text>')


def line(x1, y1, x2, y2, color, width=1.0, dash=None):
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}" stroke-width="{width}"{d}/>')


# ---------------------------------------------------------------- drawing

def axes(out, xs, ys, yticks, ylabel, xticks, show_xlabels):
    """Grid, frame, tick labels and the rotated y axis label of one panel."""
    x0, x1, y0, y1 = xs.r0, xs.r1, ys.r1, ys.r0  # y0 = top pixel
    for v in yticks:
        out.append(line(x0, ys(v), x1, ys(v), "#e5e5e5"))
        out.append(text(x0 - 6, ys(v) + 4, fmt(v), 11, "end", "#444"))
    for v in xticks:
        out.append(line(xs(v), y0, xs(v), y1, "#e5e5e5"))
        if show_xlabels:
            out.append(text(xs(v), y1 + 16, fmt(v), 11, "middle", "#444"))
    out.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" '
               f'fill="none" stroke="#888"/>')
    cy = (y0 + y1) / 2
    out.append(text(LEFT - 48, cy, ylabel, 12, "middle", extra=f' transform="rotate(-90 {LEFT - 48} {cy:.1f})"'))


def runs(values):
    """Split per-snapshot values (None = absent) into runs of consecutive present indexes."""
    out, cur = [], []
    for i, v in enumerate(values):
        if v is None:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(i)
    return out + ([cur] if cur else [])


def polyline(out, times, values, xs, ys, color):
    for run in runs(values):
        pts = [(xs(times[i]), ys(values[i])) for i in run]
        if len(pts) == 1:
            out.append(f'<circle cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="2.5" fill="{color}"/>')
        else:
            p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="2" '
                       f'stroke-linejoin="round"/>')


def level(out, labels, times, values, xs, ys, color, dash, caption):
    """A horizontal line at a per-snapshot level (cap, limit, request) where it is set, and
    a label in the right margin at its last value."""
    for run in runs(values):
        start = run[0]
        for k, i in enumerate(run):
            if k + 1 == len(run) or values[run[k + 1]] != values[i]:
                xa, xb = xs(times[start]), xs(times[i])
                if xb - xa < 8:
                    xa, xb = xa - 4, xb + 4
                out.append(line(xa, ys(values[i]), xb, ys(values[i]), color, 1.5, dash))
                if k + 1 < len(run):
                    start = run[k + 1]
    last = [v for v in values if v is not None]
    if last:
        labels.append([ys(last[-1]), caption(last[-1]), color])


def margin_labels(out, labels, top, bottom):
    """Right-margin labels, nudged apart so they do not overlap."""
    labels.sort(key=lambda l: l[0])
    for a, b in zip(labels, labels[1:]):
        b[0] = max(b[0], a[0] + 12)
    shift = max(0.0, labels[-1][0] - bottom) if labels else 0.0
    for y, s, color in labels:
        out.append(text(W - RIGHT + 6, max(top + 4, y - shift) + 4, s, 11, "start", color))


def legend(series, top):
    """Legend rows under the title; returns (elements, y below the legend)."""
    items = [("line", s["color"], s["label"]) for s in series]
    items += [("x", REFUSED, "x = allocation refused at the cap"),
              ("dash", "#555", "cap / limit"), ("dot", "#555", "request")]
    out, x, y = [], LEFT, top
    for kind, color, label in items:
        width = 30 + 6.6 * len(label)
        if x + width > W - 20 and x > LEFT:
            x, y = LEFT, y + 18
        if kind == "x":
            out += [line(x + 7, y - 8, x + 15, y, color, 2), line(x + 7, y, x + 15, y - 8, color, 2)]
        else:
            dash = {"dash": "6 4", "dot": "2 3"}.get(kind)
            out.append(line(x, y - 4, x + 22, y - 4, color, 2.5 if kind == "line" else 1.5, dash))
        out.append(text(x + 28, y, label, 12))
        x += width + 14
    return out, y + 14


def render(snaps, title):
    series = collect(snaps)
    t0 = snaps[0]["time"]
    times = [s["time"] - t0 for s in snaps]
    span = times[-1]
    xstep = 1.0 if span <= 10 else 5.0 if span <= 60 else nice_step(span, 10)
    xtop = max(xstep, math.ceil(span / xstep - 1e-9) * xstep)

    out = [text(W / 2, 30, title, 18, "middle", extra=' font-weight="bold"')]
    elems, top = legend(series, 54)
    out += elems
    height = max(H, top + 400)
    avail = height - BOTTOM - top - 30  # 30 px between the panels
    mem_top, mem_bot = top, top + avail * 0.55
    cpu_top, cpu_bot = mem_bot + 30, height - BOTTOM

    # Memory panel: y up to the largest cap or usage plus 10 %, not to the device total.
    rows = [r for s in series for r in s["rows"] if r]
    peak = max([r["used"] or 0 for r in rows] + [r["limit"] or 0 for r in rows] + [0]) / GIB
    ymax = peak * 1.1 if peak > 0 else 1.0
    xs = Scale(0, xtop, LEFT, W - RIGHT)
    ys = Scale(0, ymax, mem_bot, mem_top)
    xticks = tick_values(xtop, xstep)
    axes(out, xs, ys, tick_values(ymax, nice_step(ymax, 5)), "memory held (GiB)", xticks, False)
    totals = sorted({v for s in snaps for v in s["totals"].values() if v})
    if totals:
        note = "device memory " + " / ".join(fmt(v / GIB) for v in totals) + " GiB"
        out.append(text(W - RIGHT - 6, mem_top + 14, note, 11, "end", "#777"))
    labels = []
    for s in series:
        cap = [r["limit"] / GIB if r and r["limit"] is not None else None for r in s["rows"]]
        level(out, labels, times, cap, xs, ys, s["color"], "6 4", lambda v: f"cap {fmt(v)} GiB")
    marks = []  # drawn after all the lines so that no line hides them
    for s in series:
        used = [r["used"] / GIB if r and r["used"] is not None else None for r in s["rows"]]
        polyline(out, times, used, xs, ys, s["color"])
        seen = None
        for i, r in enumerate(s["rows"]):
            if not r or r["refusals"] is None:
                continue
            base = seen if seen is not None else (r["refusals"] if i == 0 else 0)
            if r["refusals"] > base and used[i] is not None:
                x, y = xs(times[i]), ys(used[i])
                marks += [line(x - 4, y - 4, x + 4, y + 4, REFUSED, 2), line(x - 4, y + 4, x + 4, y - 4, REFUSED, 2)]
            seen = r["refusals"]
    out += marks
    margin_labels(out, labels, mem_top, mem_bot)

    # Compute panel: share of the device in the last second, with limits and requests.
    smax = max([r["share"] or 0 for r in rows] + [100.0])
    ys = Scale(0, smax, cpu_bot, cpu_top)
    axes(out, xs, ys, tick_values(smax, 20), "compute share (% of device)", xticks, True)
    labels = []
    for s in series:
        for key, dash, word in (("limit_pct", "6 4", "limit"), ("request_pct", "2 3", "request")):
            vals = [r[key] if r else None for r in s["rows"]]
            level(out, labels, times, vals, xs, ys, s["color"], dash, lambda v, w=word: f"{w} {fmt(v)}%")
    for s in series:
        polyline(out, times, [r["share"] if r else None for r in s["rows"]], xs, ys, s["color"])
    margin_labels(out, labels, cpu_top, cpu_bot)
    out.append(text((LEFT + W - RIGHT) / 2, cpu_bot + 36, "time since first snapshot (s)", 12, "middle"))

    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height:.0f}" '
            f'viewBox="0 0 {W} {height:.0f}" font-family="sans-serif">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n')
    return head + "\n".join(out) + "\n</svg>\n", len(series), span


def main():
    ap = argparse.ArgumentParser(description="Plot `cuslice status --json` snapshots (JSONL) as an SVG.")
    ap.add_argument("timeline", help="JSONL file, one `cuslice status --json` object per line")
    ap.add_argument("out", help="SVG file to write")
    ap.add_argument("--title", default="cuslice: memory and compute share per slice")
    args = ap.parse_args()
    try:
        snaps = load(args.timeline)
    except InputError as e:
        print(f"plot-slices: error: {e}", file=sys.stderr)
        return 2
    svg, nslices, span = render(snaps, args.title)
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        print(f"plot-slices: error: {args.out}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(snaps)} snapshots, {nslices} slices, {span:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
