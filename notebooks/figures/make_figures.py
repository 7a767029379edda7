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


def local_sgd():
    """Notebook 04: DDP syncs gradients every step; local SGD lets replicas drift k steps, then averages them."""
    parts = [text(20, 22, "DDP: all_reduce of gradients in every backward", 13, anchor="start", bold=True),
             text(20, 132, "local SGD (k = 4): local steps, then all_reduce(SUM) / N of the weights", 13,
                  anchor="start", bold=True)]
    x0, dx = 60, 52
    for step in range(1, 13):  # DDP row: one sync per step
        x = x0 + (step - 1) * dx
        parts.append(box(x, 36, 40, 24, f"{step}", fill="#f4f4f4", size=11))
        parts.append(f"<line x1='{x + 20}' y1='62' x2='{x + 20}' y2='84' stroke='#b08900' stroke-width='3'/>")
    parts.append(text(x0 - 10, 100, "every step: replicas identical, one all_reduce per step (per bucket)", 11,
                      anchor="start"))
    for rank, color in enumerate(COLORS[:2]):  # local SGD row: two replicas drift, then meet
        points, y_mid = [], 190
        for step in range(0, 13):
            x = x0 + step * dx - 6
            since = step % 4
            spread = 0 if since == 0 else 7 * since
            points.append(f"{x},{y_mid + (spread if rank else -spread)}")
        parts.append(f"<polyline points='{' '.join(points)}' fill='none' stroke='{color}' stroke-width='2.5'/>")
        parts.append(text(x0 - 14, y_mid + (26 if rank else -18), f"rank {rank}", 11, anchor="end"))
    for step in (4, 8, 12):
        x = x0 + step * dx - 6
        parts.append(f"<line x1='{x}' y1='150' x2='{x}' y2='232' stroke='#b08900' stroke-width='3'/>")
        parts.append(text(x, 250, f"average after step {step}", 11))
    parts.append(text(380, 274, "between averagings no communication: each replica follows its own data", 11))
    return svg(770, 284, "".join(parts))


def dp_vs_ddp():
    """Notebook 01: who sends what to whom in one step, DataParallel (left) and DDP (right)."""
    parts = [text(215, 24, "DataParallel: 1 process, 1 thread per device", 15, bold=True),
             box(20, 90, 170, 96, "", fill=COLORS[0] + "33", stroke=COLORS[0]),
             text(105, 112, "cuda:0 = master", 13, bold=True), text(105, 132, "replica 0 = the master", 11),
             text(105, 150, "loss on the whole batch", 11), text(105, 168, "optimizer.step()", 11)]
    for i, y in enumerate((44, 174)):
        color = COLORS[i + 1]
        parts.append(box(280, y, 150, 56, "", fill=color + "33", stroke=color))
        parts.append(text(355, y + 24, f"cuda:{i + 1}", 13, bold=True))
        parts.append(text(355, y + 42, "replica (re-made each step)", 10))
        down, up = (y + 18, y + 38)
        parts.append(arrow(190, 120 if i == 0 else 156, 278, down))
        parts.append(arrow(280, up, 192, 132 if i == 0 else 168))
    parts += [text(105, 62, "out: 1 inputs, 2 weights (P)", 11), text(105, 78, "back: 3 outputs, 4 gradients (P)", 11),
              text(215, 280, "master link: at most 2(N-1)P + inputs and outputs per step;", 12),
              text(215, 298, "the other devices wait while the master works alone", 12)]
    centers = [(680, 70), (790, 200), (570, 200)]
    parts.append(text(680, 24, "DDP: 1 process per device, no master", 15, bold=True))
    for rank, (cx, cy) in enumerate(centers):
        nx, ny = centers[(rank + 1) % 3]
        parts.append(arrow(cx + (nx - cx) * 0.42, cy + (ny - cy) * 0.42 + 10, cx + (nx - cx) * 0.58, cy + (ny - cy) * 0.58 + 10))
    for rank, (cx, cy) in enumerate(centers):
        color = COLORS[rank]
        parts.append(box(cx - 75, cy - 26, 150, 60, "", fill=color + "33", stroke=color))
        parts.append(text(cx, cy - 6, f"rank {rank}", 13, bold=True))
        parts.append(text(cx, cy + 10, "model, optimizer,", 11))
        parts.append(text(cx, cy + 25, "its own data", 11))
    parts += [text(680, 158, "ring all-reduce", 12, bold=True), text(680, 174, "of the gradients", 11),
              text(680, 280, "on a ring each rank sends and receives 2(N-1)/N x P per step,", 12),
              text(680, 298, "during backward; every rank does the same work", 12)]
    parts.append("<line x1='450' y1='10' x2='450' y2='305' stroke='#bbb' stroke-dasharray='4 4'/>")
    return svg(900, 312, "".join(parts))


def ddp_registration():
    """Notebook 03: what DDP(module) fixes at construction, what it does every step, what it never sees."""
    parts = [text(370, 22, "What DDP knows about your model", 16, bold=True),
             box(20, 40, 330, 34, "DDP(module): built once", fill="#eef3fb", bold=True),
             text(30, 96, "1. broadcasts rank 0's parameters and buffers", 12, anchor="start"),
             text(30, 116, "2. registers the parameters that require grad", 12, anchor="start"),
             text(46, 134, "(gradient hooks, buckets: a fixed list)", 11, anchor="start"),
             box(390, 40, 330, 34, "every training step", fill="#eef7ee", bold=True),
             text(400, 96, "forward: broadcasts rank 0's buffers (by default)", 12, anchor="start"),
             text(400, 116, "backward: averages the gradients of the", 12, anchor="start"),
             text(400, 134, "registered parameters, bucket by bucket", 12, anchor="start"),
             arrow(350, 57, 388, 57),
             box(20, 156, 700, 34, "after construction, DDP never looks again at", fill="#fdecea", stroke="#C44E52", bold=True),
             text(30, 212, "a parameter value edited on one rank: never re-synced", 12, anchor="start"),
             text(30, 232, "a layer added later: its gradients are never averaged", 12, anchor="start"),
             text(390, 212, "requires_grad turned off: reduction never finishes", 12, anchor="start"),
             text(390, 232, "requires_grad turned on: its gradients stay local", 12, anchor="start"),
             text(370, 262, "values: edit every rank alike, or broadcast;  structure: change every rank, "
                            "new DDP, new optimizer", 11, bold=True)]
    return svg(740, 276, "".join(parts))


def ddp_start_02():
    """Notebook 02: what DistributedDataParallel synchronizes, and when."""
    parts = [text(370, 22, "what DDP copies from rank 0, and when (default settings)", 15, bold=True)]
    steps = [("DDP(model)", "1. check counts (all-gather), shapes (rank 0's)", "counts: all raise; shapes: that rank"),
             ("DDP(model)", "2. broadcast rank 0's parameters and buffers", "in place: same tensor objects"),
             ("a forward", "3. broadcast rank 0's buffers (forward_sync_buffers)", "the first, or after a grad forward"),
             ("each backward", "4. all_reduce the gradients (mean)", "same update: equal parameters stay equal")]
    for i, (when, what, note) in enumerate(steps):
        y = 40 + i * 46
        parts.append(box(10, y, 120, 34, when, fill="#eef3fb", size=12))
        parts.append(arrow(130, y + 17, 158, y + 17))
        parts.append(box(160, y, 330, 34, what, fill=COLORS[i] + "33", stroke=COLORS[i], size=12))
        parts.append(text(500, y + 22, note, 11, anchor="start"))
    parts.append(text(370, 238, "never copied: plain tensor attributes, optimizer state, RNG streams, the data; "
                                "later edits: only at Join's end", 11))
    return svg(740, 250, "".join(parts))


def two_nodes():
    """Notebook 05: two torchrun agents ("nodes") on one machine, meeting at one rendezvous."""
    parts = [box(250, 8, 220, 36, "c10d rendezvous at 127.0.0.1:PORT", fill="#fff7e6", size=12)]
    for node in range(2):
        x = 40 + node * 360
        parts.append(box(x, 80, 280, 120, "", fill="#f8f8f8"))
        parts.append(text(x + 140, 100, f"node {node}: one torchrun agent, 2 workers", 12, bold=True))
        parts.append(arrow(x + 140, 80, 360, 46))
        for local in range(2):
            rank = node * 2 + local
            color = COLORS[rank]
            parts.append(box(x + 15 + local * 135, 120, 115, 60, "", fill=color + "33", stroke=color))
            parts.append(text(x + 72 + local * 135, 145, f"RANK {rank}", 13, bold=True))
            parts.append(text(x + 72 + local * 135, 165, f"LOCAL_RANK {local}", 11))
    parts.append(text(360, 225, "global ranks number the whole job; local ranks restart at 0 on each node", 12))
    return svg(720, 240, "".join(parts))


FIGURES = {
    "05_two_nodes.svg": two_nodes(),
    "02_ddp_start.svg": ddp_start_02(),
    "04_local_sgd.svg": local_sgd(),
    "launcher.svg": launcher(),
    "03_ddp_registration.svg": ddp_registration(),
    "broadcast.svg": collective("broadcast(t, src=0)", ["t = 7", "t = 1", "t = 4"],
                                ["t = 7", "t = 7", "t = 7"], "every rank gets the source rank's tensor, in place"),
    "all_reduce.svg": collective("all_reduce(t, op=SUM)", ["t = 7", "t = 1", "t = 4"],
                                 ["t = 12", "t = 12", "t = 12"], "every rank gets the sum (or MAX, MIN, ...), in place"),
    "all_gather.svg": collective("all_gather(parts, t)", ["t = 7", "t = 1", "t = 4"],
                                 ["parts = [7, 1, 4]", "parts = [7, 1, 4]", "parts = [7, 1, 4]"],
                                 "every rank gets every rank's tensor, in rank order"),
    "01_dp_vs_ddp.svg": dp_vs_ddp(),
}

if __name__ == "__main__":
    for name, content in FIGURES.items():
        (HERE / name).write_text(content)
        print("wrote", HERE / name)
