"""Widgets for notebook cells: the live view of a running lab.

Introduced in notebooks/00_start_here.ipynb. Updates travel as widget messages, which nbval does not
compare, so a cell's compared output is only what the launcher prints once the run is over.
"""
import html

import ipywidgets as widgets

MAX_LINES = 12  # per rank: the view is a glance at progress, the full output is printed at the end


class LiveRunView(widgets.VBox):
    """The run's clock against its timeout, and each rank's latest output lines (``lines=True``) or only
    its state (a quiet run, whose cell prints its results at the end), while a run is going."""

    def __init__(self, label, nproc, timeout, lines=True):
        self.label, self.timeout, self.show_lines = label, timeout, lines
        self.lines = {rank: [] for rank in range(nproc)}
        self.ready = set()
        self.header = widgets.HTML()
        self.bar = widgets.FloatProgress(min=0.0, max=float(timeout), layout={"width": "40%"})
        self.body = widgets.HTML()
        self._dirty, self._last_draw = True, None
        super().__init__([self.header, self.bar, self.body])
        self.tick(0.0, None, set())
        from IPython.display import display
        display(self)

    def __repr__(self):  # what a notebook shows without a widget frontend (GitHub, nbval)
        return f"[live view of {self.label} while it runs]"

    def add(self, rank, text):
        self.lines.setdefault(rank, []).append(text)
        del self.lines[rank][:-MAX_LINES]
        self._dirty = True

    def tick(self, since_launch, since_ready, ready):
        """since_ready: the timeout's clock (None until every rank is ready); ready: the ranks that are."""
        if len(ready) != len(self.ready):
            self.ready, self._dirty = set(ready), True
        elif self._last_draw is not None and since_launch - self._last_draw < 0.25:
            return  # a redraw per poll would flood the frontend
        self._last_draw = since_launch
        n = len(self.lines)
        name = html.escape(self.label)
        if since_ready is None:  # the timeout has not started: say so rather than fill its bar
            self.bar.value = 0.0
            self.header.value = (f"<b>starting {name}</b>: {len(self.ready)} of {n} ranks ready after "
                                 f"{since_launch:.1f} s (torch imports); the {self.timeout:.0f} s timeout "
                                 "starts when all are")
        else:
            self.bar.value = min(since_ready, self.timeout)
            self.header.value = (f"<b>running {name}</b> on {n} ranks: {since_ready:.1f} s of a "
                                 f"{self.timeout:.0f} s timeout")
        if self._dirty:
            self.body.value = "<pre style='margin:0'>" + "\n".join(
                self._rank_block(rank) for rank in sorted(self.lines)) + "</pre>"
            self._dirty = False

    def _rank_block(self, rank):
        state = "running" if rank in self.ready else "starting"
        if not self.show_lines:  # a quiet run: its cell prints the results when it ends
            return f"<b>rank {rank}</b>: {state}"
        return f"<b>rank {rank}</b>\n" + html.escape("\n".join(self.lines[rank] or [f"({state})"]))
