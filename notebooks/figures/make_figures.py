"""Draw the course's diagrams as small SVG files: python notebooks/figures/make_figures.py

Plain SVG text, no plotting library: the files are the same on every machine, so they are committed
and shown by the notebooks' Markdown cells (and by any notebook viewer on the web).
"""
from pathlib import Path

HERE = Path(__file__).parent
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
FONT = "font-family='Helvetica, Arial, sans-serif'"


def box(x, y, w, h, text, fill="#ffffff", stroke="#333", size=13, bold=False):
    weight = "bold" if bold else "normal"
    return (f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='6' fill='{fill}' stroke='{stroke}'/>"
            f"<text x='{x + w / 2}' y='{y + h / 2 + size / 3}' text-anchor='middle' font-size='{size}' "
            f"font-weight='{weight}' {FONT}>{text}</text>")


def text(x, y, s, size=13, anchor="middle", bold=False):
    weight = "bold" if bold else "normal"
    return f"<text x='{x}' y='{y}' text-anchor='{anchor}' font-size='{size}' font-weight='{weight}' {FONT}>{s}</text>"


def arrow(x1, y1, x2, y2):
    return f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='#555' stroke-width='1.5' marker-end='url(#head)'/>"


def svg(width, height, body):
    head = ("<defs><marker id='head' markerWidth='8' markerHeight='8' refX='7' refY='4' orient='auto'>"
            "<path d='M0,0 L8,4 L0,8 z' fill='#555'/></marker></defs>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}'><rect width='100%' height='100%' fill='white'/>{head}{body}</svg>\n")


def collective(title, before, after, note):
    """Three ranks, each a row: its tensor before (left) and after (right) the call."""
    parts = [text(260, 24, title, 16, bold=True)]
    parts.append(text(95, 50, "before", 12)), parts.append(text(405, 50, "after", 12))
    parts.append(box(215, 62, 90, 124, "", fill="#fff7e6", stroke="#b08900"))
    parts.append(text(260, 128, title.split("(")[0], 12, bold=True))
    for rank in range(3):
        y = 62 + rank * 46
        color = COLORS[rank]
        parts.append(text(18, y + 22, f"rank {rank}", 12, anchor="start"))
        parts.append(box(70, y, 110, 32, before[rank], fill=color + "33", stroke=color))
        parts.append(arrow(180, y + 16, 213, 124 + (rank - 1) * 12))  # every input meets in the collective
        parts.append(arrow(305, 124 + (rank - 1) * 12, 328, y + 16))   # and every rank gets a result
        parts.append(box(330, y, 150, 32, after[rank], fill="#f4f4f4"))
    parts.append(text(260, 218, note, 12))
    return svg(520, 232, "".join(parts))


def launcher():
    parts = [box(10, 70, 130, 44, "notebook cell", fill="#eef3fb"),
             text(75, 132, "run_lab(\"00\", nproc=3)", 11),
             arrow(140, 92, 185, 92),
             box(190, 70, 130, 44, "ddpcourse launcher", fill="#fff7e6", size=12),
             text(255, 132, "no torch import", 11),
             arrow(320, 92, 365, 92),
             box(370, 70, 130, 44, "torchrun agent", fill="#f4f4f4"),
             text(435, 132, "rendezvous on 127.0.0.1", 11)]
    for rank in range(3):
        y = 14 + rank * 58
        parts.append(arrow(500, 92, 555, y + 20))
        parts.append(box(560, y, 150, 40, f"rank {rank}: your lab", fill=COLORS[rank] + "33", stroke=COLORS[rank], size=12))
    parts.append(text(360, 196, "each rank writes its output, report(...) values and, at a timeout, its stack "
                                "to a run folder the launcher reads", 11))
    return svg(720, 210, "".join(parts))


FIGURES = {
    "launcher.svg": launcher(),
    "broadcast.svg": collective("broadcast(t, src=0)", ["t = 7", "t = 1", "t = 4"],
                                ["t = 7", "t = 7", "t = 7"], "every rank gets the source rank's tensor, in place"),
    "all_reduce.svg": collective("all_reduce(t, op=SUM)", ["t = 7", "t = 1", "t = 4"],
                                 ["t = 12", "t = 12", "t = 12"], "every rank gets the sum (or MAX, MIN, ...), in place"),
    "all_gather.svg": collective("all_gather(parts, t)", ["t = 7", "t = 1", "t = 4"],
                                 ["parts = [7, 1, 4]", "parts = [7, 1, 4]", "parts = [7, 1, 4]"],
                                 "every rank gets every rank's tensor, in rank order"),
}

if __name__ == "__main__":
    for name, content in FIGURES.items():
        (HERE / name).write_text(content)
        print("wrote", HERE / name)
