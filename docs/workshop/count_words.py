"""How many words a learner reads in each notebook, and how long that takes: the "reading" column of the time
table in docs/instructors.md is made from this script's numbers (tests/test_docs.py checks that it is).

    python docs/workshop/count_words.py            # the table, all notebooks
    python docs/workshop/count_words.py 00 03      # some of them

What counts as read (standard library only; the notebooks are read as JSON, nothing is run):

- the prose of markdown cells: sentences, list items, headings, the text of table cells, link and image
  texts (not their addresses), inline code spans (a span such as `dist.all_reduce` is one word);
- each Predict: its question and its options (the string arguments of ``predict(...)`` in a code cell), and
  the "why" that the widget shows once the learner has picked (notebooks/answers/NN.json).

What does not count: code (code cells, and fenced code blocks inside markdown cells), comments and
docstrings in code, and cell outputs. Learners glance at those rather than read them word by word; the time
they take is the time table's allowance for running cells, not part of this count.

A word is a whitespace-separated token with at least one letter or digit in it. Reading speed: 200 words a
minute, rounded up per notebook (a careful pace for technical prose read on a screen).

Sections are told apart by their headings. A **claims section** is one whose heading speaks of claims,
verdicts or what the sources say (e.g. "## 6. Claims from the sources, tested", "### Every claim of the
source (000), decided", "## 8. What the sources say about launching, tested"), down to the next heading of
its level or above: the tables that decide a source's statements with a run. An **appendix** (a heading
that starts with "Appendix") counts the same way: detail kept for whoever wants it, after the lab. The
workshop leaves both for after the workshop, so the table shows their words apart and the in-room reading
without them.
"""
import ast
import json
import math
import re
import sys
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = COURSE_ROOT / "notebooks"
WORDS_PER_MINUTE = 200
CLAIMS_HEADING = re.compile(r"claim|verdict|\bsources?\s+says?\b|^(?:\d+\.\s*)?appendix\b", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*)")
WORD = re.compile(r"[^\W_]")  # a letter or a digit


def reading_minutes(words):
    """Minutes to read ``words`` at WORDS_PER_MINUTE, rounded up."""
    return math.ceil(words / WORDS_PER_MINUTE)


def count(text):
    """The words of plain text: whitespace-separated tokens with a letter or digit."""
    return sum(1 for token in text.split() if WORD.search(token))


def prose(markdown_line):
    """A markdown line as the text a reader sees: links and images as their text, no tags, no table rules."""
    line = markdown_line.strip()
    if re.fullmatch(r"\|?[\s:|-]+\|?", line) and "-" in line:  # a table's rule row
        return ""
    line = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", line)      # [text](address), ![alt](path)
    line = re.sub(r"<[^>]+>", " ", line)                          # HTML tags
    return line.replace("|", " ")


def predict_texts(source, answers):
    """The question, options and why of each ``predict(...)`` call in a code cell's source."""
    lines = ["pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    texts = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "predict" and node.args):
            continue
        for argument in node.args[1:]:
            texts += [n.value for n in ast.walk(argument) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        qid = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
        texts.append(answers.get(qid, {}).get("why", ""))
    return texts


def notebook_words(path):
    """{"all": words, "claims": words in claims sections, "sections": [(heading, words, is_claims)]} for a
    notebook; "sections" lists every heading in order with the words under it (up to the next heading)."""
    path = Path(path)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    answers_file = NOTEBOOKS / "answers" / f"{path.name[:2]}.json"
    answers = json.loads(answers_file.read_text(encoding="utf-8")) if answers_file.exists() else {}
    open_headings = []                 # (level, heading text) of the sections the reader is in
    sections = [["(before the first heading)", 0, False]]

    def add(words):
        sections[-1][1] += words

    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            add(sum(count(text) for text in predict_texts(source, answers)))
            continue
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in source.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
                continue
            heading = None if fenced else HEADING.match(line)
            if heading:
                level = len(heading.group(1))
                open_headings = [(lv, text) for lv, text in open_headings if lv < level] + [(level, heading.group(2))]
                claims = any(CLAIMS_HEADING.search(text) for _, text in open_headings)
                sections.append([heading.group(2).strip(), 0, claims])
            if not fenced:
                add(count(prose(line)))
    total = sum(words for _, words, _ in sections)
    claims = sum(words for _, words, is_claims in sections if is_claims)
    return {"all": total, "claims": claims, "sections": [tuple(s) for s in sections]}


def course_words(numbers=None):
    """{NN: notebook_words(...)} for notebooks/NN_*.ipynb (all, or the numbers given)."""
    found = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if numbers is None or path.name[:2] in numbers:
            found[path.name[:2]] = notebook_words(path)
    return found


def table(found):
    """The table this script prints, as lines."""
    head = ("notebook", "words", "min", "claims words", "in the room", "min")
    lines = ["{:<10} {:>7} {:>5} {:>13} {:>12} {:>5}".format(*head)]
    sums = [0, 0, 0, 0, 0]
    for number, words in found.items():
        room = words["all"] - words["claims"]
        row = [words["all"], reading_minutes(words["all"]), words["claims"], room, reading_minutes(room)]
        sums = [s + r for s, r in zip(sums, row)]
        lines.append("{:<10} {:>7} {:>5} {:>13} {:>12} {:>5}".format(number, *row))
    lines.append("{:<10} {:>7} {:>5} {:>13} {:>12} {:>5}".format("total", *sums))
    lines.append(f"minutes at {WORDS_PER_MINUTE} words a minute, rounded up per notebook; claims words: the "
                 "claims sections (after the workshop); in the room: the rest")
    claims = {number: [heading for heading, _, is_claims in words["sections"] if is_claims and
                       CLAIMS_HEADING.search(heading)] for number, words in found.items()}
    lines += [f"claims sections of {number}: " + ("; ".join(headings) or "none") for number, headings in claims.items()]
    return lines


if __name__ == "__main__":
    print("\n".join(table(course_words(sys.argv[1:] or None))))
