"""Widgets for notebook cells: the live view of a running lab.

Introduced in notebooks/00_start_here.ipynb. Updates travel as widget messages, which nbval does not
compare, so a cell's compared output is only what the launcher prints once the run is over.
"""
import html

import ipywidgets as widgets

MAX_LINES = 12  # per rank: the view is a glance at progress, the full output is printed at the end


class LiveRunView(widgets.VBox):
    """Elapsed time against the timeout, and each rank's latest output lines, while a run is going."""

    def __init__(self, label, nproc, timeout):
        self.label, self.timeout = label, timeout
        self.lines = {rank: [] for rank in range(nproc)}
        self.header = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0.0, max=float(timeout), layout={"width": "40%"})
        self.body = widgets.HTML()
        self._dirty, self._last_draw = True, 0.0
        super().__init__([self.header, self.bar, self.body])
        self.tick(0.0)
        from IPython.display import display
        display(self)

    def __repr__(self):  # what a notebook shows without a widget frontend (GitHub, nbval)
        return f"[live view of {self.label} while it runs]"

    def add(self, rank, text):
        self.lines.setdefault(rank, []).append(text)
        del self.lines[rank][:-MAX_LINES]
        self._dirty = True

    def tick(self, elapsed):
        if elapsed - self._last_draw < 0.25 and elapsed > 0:
            return  # a redraw per poll would flood the frontend
        self._last_draw = elapsed
        self.bar.value = min(elapsed, self.timeout)
        self.header.value = (f"<b>running {html.escape(self.label)}</b> on {len(self.lines)} ranks: "
                             f"{elapsed:.1f} s of a {self.timeout:.0f} s timeout")
        if self._dirty:
            blocks = [f"<b>rank {rank}</b>\n" + html.escape("\n".join(lines or ["(starting)"]))
                      for rank, lines in sorted(self.lines.items())]
            self.body.value = "<pre style='margin:0'>" + "\n".join(blocks) + "</pre>"
            self._dirty = False
