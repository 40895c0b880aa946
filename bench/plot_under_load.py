#!/usr/bin/env python3
"""Plots bench/decode_under_load's JSON lines: decode-kernel slowdown (time / idle time) against
the achieved transfer rate, one panel per transfer kind (d2d, peer, nccl, h2d, in that order), one
colour per shape, prefetch off (solid, circles) and on (dashed, squares); the point at the
ITL-derived pacing rate is marked with an x. The cross-GPU kinds' panels (peer, nccl) also draw the
peer copy ceiling measured in the same run (GPU 1 -> GPU 0 alone) as a dotted vertical line.

    python3 bench/plot_under_load.py RESULTS.jsonl [-o OUT.png]

Uses matplotlib when it is importable; otherwise draws the same figure with a small pure-Python
rasteriser and PNG writer (zlib + struct), so the plot needs nothing beyond the standard library.
"""
import argparse
import json
import math
import struct
import sys
import zlib


def load(path):
    points, ceilings, alone = [], [], {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            if d.get("bench") != "decode_under_load":
                continue
            if d.get("impl") == "point":
                points.append(d)
            elif d.get("impl") == "ceiling":
                ceilings.append(d)
            elif d.get("impl") == "transfer_alone":
                alone[d["kind"]] = d["gbps"]
    return points, ceilings, alone


def series(points):
    """{kind: {(model, batch, ctx, prefetch): [(x, y, is_itl), ...] sorted by x}}"""
    out = {}
    for p in points:
        key = (p["model"], p["batch"], p["ctx"], p["prefetch"])
        out.setdefault(p["kind"], {}).setdefault(key, []).append(
            (p["xfer_gbps"], p["slowdown"], p["rate_pct"] == -1))
    for kind in out:
        for key in out[kind]:
            out[kind][key].sort()
    return out


KIND_ORDER = ["d2d", "peer", "nccl", "h2d"]


def ordered_kinds(data):
    return [k for k in KIND_ORDER if k in data] + sorted(k for k in data if k not in KIND_ORDER)


def link_ceiling(ceilings, kind):
    """The peer copy ceiling (GB/s payload, first measured) for a cross-GPU kind, else None."""
    if kind not in ("peer", "nccl"):
        return None
    for c in ceilings:
        if c.get("peer_copy_gbps"):
            return c["peer_copy_gbps"]
    return None


def shape_label(key):
    model, b, ctx, _ = key
    return "%s B%d %dk" % (model, b, ctx // 1024)


COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def plot_matplotlib(data, title, out, ceilings):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kinds = ordered_kinds(data)
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 5.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        shapes = sorted({k[:3] for k in data[kind]})
        for i, shape in enumerate(shapes):
            c = tuple(v / 255 for v in COLOURS[i % len(COLOURS)])
            for pf in (False, True):
                pts = data[kind].get(shape + (pf,), [])
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ys = [p[1] for p in pts]
                ax.plot(xs, ys, ("--" if pf else "-"), marker=("s" if pf else "o"), color=c,
                        markersize=4, label=shape_label(shape + (pf,)) + (" pf on" if pf else " pf off"))
                for x, y, itl in pts:
                    if itl:
                        ax.plot([x], [y], "x", color="k", markersize=9)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        link = link_ceiling(ceilings, kind)
        if link:
            ax.axvline(link, color="k", linestyle=":", linewidth=1,
                       label="peer copy alone %.0f GB/s" % link)
        ax.set_title("%s: %s" % (kind, title))
        ax.set_xlabel("achieved transfer rate (GB/s payload)")
        ax.set_ylabel("kernel time / idle kernel time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# ---- pure-Python fallback --------------------------------------------------------------------------

# 5x7 glyphs, one int per row, bit 4 = leftmost column. Lower case is drawn as upper case.
FONT = {
    " ": [0, 0, 0, 0, 0, 0, 0],
    "0": [14, 17, 19, 21, 25, 17, 14], "1": [4, 12, 4, 4, 4, 4, 14], "2": [14, 17, 1, 2, 4, 8, 31],
    "3": [31, 2, 4, 2, 1, 17, 14], "4": [2, 6, 10, 18, 31, 2, 2], "5": [31, 16, 30, 1, 1, 17, 14],
    "6": [6, 8, 16, 30, 17, 17, 14], "7": [31, 1, 2, 4, 8, 8, 8], "8": [14, 17, 17, 14, 17, 17, 14],
    "9": [14, 17, 17, 15, 1, 2, 12],
    "A": [14, 17, 17, 31, 17, 17, 17], "B": [30, 17, 17, 30, 17, 17, 30], "C": [14, 17, 16, 16, 16, 17, 14],
    "D": [28, 18, 17, 17, 17, 18, 28], "E": [31, 16, 16, 30, 16, 16, 31], "F": [31, 16, 16, 30, 16, 16, 16],
    "G": [14, 17, 16, 23, 17, 17, 15], "H": [17, 17, 17, 31, 17, 17, 17], "I": [14, 4, 4, 4, 4, 4, 14],
    "J": [7, 2, 2, 2, 2, 18, 12], "K": [17, 18, 20, 24, 20, 18, 17], "L": [16, 16, 16, 16, 16, 16, 31],
    "M": [17, 27, 21, 21, 17, 17, 17], "N": [17, 17, 25, 21, 19, 17, 17], "O": [14, 17, 17, 17, 17, 17, 14],
    "P": [30, 17, 17, 30, 16, 16, 16], "Q": [14, 17, 17, 17, 21, 18, 13], "R": [30, 17, 17, 30, 20, 18, 17],
    "S": [15, 16, 16, 14, 1, 1, 30], "T": [31, 4, 4, 4, 4, 4, 4], "U": [17, 17, 17, 17, 17, 17, 14],
    "V": [17, 17, 17, 17, 17, 10, 4], "W": [17, 17, 17, 21, 21, 21, 10], "X": [17, 17, 10, 4, 10, 17, 17],
    "Y": [17, 17, 17, 10, 4, 4, 4], "Z": [31, 1, 2, 4, 8, 16, 31],
    ".": [0, 0, 0, 0, 0, 12, 12], ",": [0, 0, 0, 0, 12, 4, 8], "-": [0, 0, 0, 31, 0, 0, 0],
    "+": [0, 4, 4, 31, 4, 4, 0], "/": [0, 1, 2, 4, 8, 16, 0], ":": [0, 12, 12, 0, 12, 12, 0],
    "(": [2, 4, 8, 8, 8, 4, 2], ")": [8, 4, 2, 2, 2, 4, 8], "%": [24, 25, 2, 4, 8, 19, 3],
    "=": [0, 0, 31, 0, 31, 0, 0], "_": [0, 0, 0, 0, 0, 0, 31], "x": [0, 17, 10, 4, 10, 17, 0],
}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray([255]) * (w * h * 3)

    def set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def dot(self, x, y, c, r=1):
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                self.set(x + dx, y + dy, c)

    def line(self, x0, y0, x1, y1, c, width=1, dash=0):
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(n + 1):
            if dash and (i // dash) % 2 == 1:
                continue
            x = round(x0 + (x1 - x0) * i / n)
            y = round(y0 + (y1 - y0) * i / n)
            self.dot(x, y, c, width // 2)

    def text(self, x, y, s, c=(0, 0, 0), scale=1):
        for ch in s:
            g = FONT.get(ch) or FONT.get(ch.upper()) or FONT[" "]
            for row, bits in enumerate(g):
                for col in range(5):
                    if bits & (16 >> col):
                        for sy in range(scale):
                            for sx in range(scale):
                                self.set(x + col * scale + sx, y + row * scale + sy, c)
            x += 6 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag, data):
            c = struct.pack(">I", len(data)) + tag + data
            return c + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)))
            f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
            f.write(chunk(b"IEND", b""))


def nice_ticks(lo, hi, n=5):
    span = hi - lo if hi > lo else 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            out.append(round(t, 10))
        t += step
    return out


def fmt(v):
    return ("%d" % v) if abs(v - round(v)) < 1e-9 else ("%.2f" % v).rstrip("0")


def plot_fallback(data, title, out, ceilings):
    kinds = ordered_kinds(data)
    pw, ph = 620, 470          # one panel
    n_shapes = max(len({key[:3] for key in data[k]}) for k in kinds)
    ml, mr, mt, mb = 70, 20, 56, max(150, 14 * n_shapes + 40)  # the legend fits below
    W, H = pw * len(kinds), ph + mb
    cv = Canvas(W, H)
    black, grey = (0, 0, 0), (200, 200, 200)
    for k, kind in enumerate(kinds):
        ox = k * pw
        x0, x1, y0, y1 = ox + ml, ox + pw - mr, mt, ph - 40
        pts = [p for s in data[kind].values() for p in s]
        link = link_ceiling(ceilings, kind)
        xmax = max([p[0] for p in pts] + [1e-9] + ([link] if link else [])) * 1.05
        ymin = min([p[1] for p in pts] + [1.0])
        ymax = max([p[1] for p in pts] + [1.0])
        pad = (ymax - ymin) * 0.08 or 0.05
        ymin, ymax = ymin - pad, ymax + pad

        def X(v):
            return round(x0 + (x1 - x0) * v / xmax)

        def Y(v):
            return round(y1 - (y1 - y0) * (v - ymin) / (ymax - ymin))

        for t in nice_ticks(0, xmax):
            cv.line(X(t), y0, X(t), y1, grey)
            cv.text(X(t) - 3 * len(fmt(t)), y1 + 6, fmt(t))
        for t in nice_ticks(ymin, ymax):
            cv.line(x0, Y(t), x1, Y(t), grey)
            cv.text(x0 - 6 * len(fmt(t)) - 6, Y(t) - 3, fmt(t))
        cv.line(x0, Y(1.0), x1, Y(1.0), (120, 120, 120), 1, dash=4)
        if link:
            cv.line(X(link), y0, X(link), y1, black, 1, dash=2)
            cv.text(X(link) - 6 * 14, y0 + 4, "PEER COPY %d" % round(link))
        cv.line(x0, y0, x0, y1, black)
        cv.line(x0, y1, x1, y1, black)
        cv.line(x1, y0, x1, y1, black)
        cv.line(x0, y0, x1, y0, black)
        cv.text(x0, 8, "%s: %s" % (kind, title), scale=2)
        cv.text(x0 + 80, y1 + 20, "ACHIEVED TRANSFER RATE (GB/S PAYLOAD)")
        cv.text(ox + 4, y0 - 14, "KERNEL TIME / IDLE")
        shapes = sorted({key[:3] for key in data[kind]})
        for i, shape in enumerate(shapes):
            c = COLOURS[i % len(COLOURS)]
            for pf in (False, True):
                s = data[kind].get(shape + (pf,), [])
                for a, b in zip(s, s[1:]):
                    cv.line(X(a[0]), Y(a[1]), X(b[0]), Y(b[1]), c, 2, dash=(6 if pf else 0))
                for x, y, itl in s:
                    if itl:
                        cv.line(X(x) - 5, Y(y) - 5, X(x) + 5, Y(y) + 5, black, 2)
                        cv.line(X(x) - 5, Y(y) + 5, X(x) + 5, Y(y) - 5, black, 2)
                    elif pf:
                        for d in range(-3, 4):
                            cv.line(X(x) - 3, Y(y) + d, X(x) + 3, Y(y) + d, c)
                    else:
                        cv.dot(X(x), Y(y), c, 3)
            ly = ph + 5 + 14 * i
            cv.line(ox + ml, ly + 3, ox + ml + 24, ly + 3, c, 2)
            cv.line(ox + ml + 30, ly + 3, ox + ml + 54, ly + 3, c, 2, dash=6)
            cv.text(ox + ml + 62, ly, shape_label(shape + (False,)))
        ly = ph + 5 + 14 * len(shapes) + 6
        cv.text(ox + ml, ly, "SOLID: PREFETCH OFF, DASHED: ON, X: ITL-DERIVED PACING RATE")
    cv.png(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl")
    ap.add_argument("-o", "--out", default=None)
    ap.add_argument("--fallback", action="store_true", help="use the pure-Python renderer")
    a = ap.parse_args()
    points, ceilings, alone = load(a.jsonl)
    if not points:
        sys.exit("no decode_under_load points in " + a.jsonl)
    out = a.out or a.jsonl.rsplit(".", 1)[0] + ".png"
    data = series(points)
    title = "decode slowdown vs transfer rate"
    use_mpl = not a.fallback
    if use_mpl:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            use_mpl = False
    (plot_matplotlib if use_mpl else plot_fallback)(data, title, out, ceilings)
    print("wrote %s (%s)" % (out, "matplotlib" if use_mpl else "pure-Python PNG writer"))


if __name__ == "__main__":
    main()
