"""Predict-then-reveal questions for notebook cells: ``predict(qid, question, options)``.

Introduced in notebooks/00_start_here.ipynb. The learner picks an option before running the cell that
decides it; only then does the widget say whether the guess was right and why. The answer and the why
live in notebooks/answers/NN.json (NN = the qid's prefix), never in the notebook, so neither the cell
nor its saved output gives the answer away. The widget's plain-text form (what nbval compares, and what
a viewer without the live widget shows) is the whole question and every option, the same on every run.
"""
import html
import json
import string
import textwrap
from functools import lru_cache

import ipywidgets as widgets

from ddpcourse.paths import COURSE_ROOT

ANSWERS_FOLDER = COURSE_ROOT / "notebooks" / "answers"
TEXT_WIDTH = 100
LETTERS = string.ascii_lowercase


def answers_file(qid):
    """notebooks/answers/NN.json for a qid "NN.slug"."""
    return ANSWERS_FOLDER / f"{qid.split('.', 1)[0]}.json"


@lru_cache(maxsize=None)
def _load(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def answer_for(qid):
    """(index of the right option, why) for a question, from its notebook's answers file."""
    path = answers_file(qid)
    entries = _load(path) if path.exists() else {}
    if qid not in entries:
        raise KeyError(f"no answer for {qid!r} in {path.relative_to(COURSE_ROOT).as_posix()}")
    return entries[qid]["answer"], entries[qid]["why"]


def plain_text(question, options):
    """The question and its lettered options as plain text, wrapped at TEXT_WIDTH characters."""
    lines = textwrap.wrap(f"Predict: {question}", TEXT_WIDTH, subsequent_indent="  ")
    for letter, option in zip(LETTERS, options):
        lines += textwrap.wrap(f"({letter}) {option}", TEXT_WIDTH, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines + ["(pick one in Jupyter to see the answer; the next cells decide it)"])


class Prediction(widgets.VBox):
    def __init__(self, qid, question, options):
        self.qid, self.question, self.options = qid, question, list(options)
        self.answer, self.why = answer_for(qid)
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer {self.answer} of {qid!r} is not an option index (0-{len(self.options) - 1})")
        labels = [(f"({letter}) {option}", index) for index, (letter, option) in enumerate(zip(LETTERS, self.options))]
        self.choice = widgets.RadioButtons(options=labels, value=None, layout={"width": "max-content"})
        self.verdict = widgets.HTML()
        self.choice.observe(self._reveal, names="value")
        super().__init__([widgets.HTML(f"<b>Predict:</b> {html.escape(question)}"), self.choice, self.verdict])

    def _reveal(self, change):
        picked = change["new"]
        if picked is None:
            return
        right = picked == self.answer
        head = "Right." if right else f"Not quite: the answer is <b>({LETTERS[self.answer]})</b>."
        color = "#1a7f37" if right else "#cf222e"
        self.verdict.value = f"<span style='color:{color}'>{head}</span> {html.escape(self.why)}"

    def __repr__(self):
        return plain_text(self.question, self.options)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = repr(self)  # ipywidgets cuts its text form at 110 characters
        return bundle


def predict(qid, question, options):
    """Show a multiple-choice prediction; the answer and its why appear once the learner picks."""
    return Prediction(qid, question, options)
