"""Predict-then-reveal questions for notebook cells: ``predict(question, options, answer, why)``.

Introduced in notebooks/00_start_here.ipynb. The learner picks an option before running the cell that
decides it; only then does the widget say whether the guess was right and why. Nothing is printed: the
widget's plain-text form (what nbval compares, and what a notebook viewer without widgets shows) is the
question and its options, the same on every run.
"""
import html

import ipywidgets as widgets


class Prediction(widgets.VBox):
    def __init__(self, question, options, answer, why):
        if answer not in options:
            raise ValueError(f"answer {answer!r} is not one of the options")
        self.question, self.options, self.answer, self.why = question, list(options), answer, why
        self.choice = widgets.RadioButtons(options=self.options, value=None, layout={"width": "max-content"})
        self.verdict = widgets.HTML()
        self.choice.observe(self._reveal, names="value")
        super().__init__([widgets.HTML(f"<b>Predict:</b> {html.escape(question)}"), self.choice, self.verdict])

    def _reveal(self, change):
        picked = change["new"]
        if picked is None:
            return
        right = picked == self.answer
        head = "Right." if right else f"Not quite: the answer is <b>{html.escape(self.answer)}</b>."
        color = "#1a7f37" if right else "#cf222e"
        self.verdict.value = f"<span style='color:{color}'>{head}</span> {html.escape(self.why)}"

    def __repr__(self):
        lines = [f"Predict: {self.question}"] + [f"  ( ) {option}" for option in self.options]
        return "\n".join(lines + ["(pick one in Jupyter to see the answer; the next cells decide it)"])


def predict(question, options, answer, why):
    """Show a multiple-choice prediction; the answer and `why` appear once the learner picks."""
    return Prediction(question, options, answer, why)
