"""The course tells things in the right order and only once: no Predict is answered above itself, and no
source claim gets two different verdicts in two notebooks.

    python docs/lint/course_truth.py --check   # one line per problem, exit 1; else a one-line "ok"

Why: a Predict whose answer the learner has just read is no prediction, and a claim of a source document
that notebook 01 calls "wrong" and notebook 05 calls "holds" teaches nothing. Neither shows when a cell runs,
so this reads the committed, executed notebooks (notebooks/NN_*.ipynb, outputs included),
notebooks/answers/NN.json and the registry docs/lint/claims.json; no kernel, no launch. Standard library only.

1. Questions before answers. A Predict's *answer key* is what only its right option says: the option's
   content words (crudely stemmed; stop-words and words under 3 letters dropped; identifiers such as
   drop_last kept whole; a few of the course's synonyms folded: "same"/"identical" -> "equal", "hang"/"stuck"
   -> "wait", "DP" -> "DataParallel", ...) and its numbers, less every word and number of the question and
   of the wrong options. A statement met before the Predict (a sentence, heading or table row of a markdown
   cell, a line of a code cell or of its outputs, or a sentence of an earlier notebook's "## Summary")
   gives the answer away when it holds at least 60% of the key and at least 3 of its tokens (both, for a
   key of 2): a number counts as one token, so a distinctive number gives the answer away together with the
   option's words, never alone ("6" alone is everywhere). A Predict whose question starts with "Recall" asks
   for what was taught before and is exempt. A key of one token is no evidence: most Predicts must have a
   key of 2 or more, which keeps the detector from passing by having nothing to look for. What it cannot
   see: an answer stated in other words (a table row "one per process: no contention" for "the threads take
   turns"); a reviewer still reads the lead-ins. The fix: move or reword the statement, or start the
   question with "Recall" if it asks for what was taught.
2. One verdict per claim. Notebooks 01-05 end with claims tables (columns "the source says" and "verdict on
   torch 2.13"); every row has a source document and a verdict. Rows of two notebooks are the same claim
   when docs/lint/claims.json says so ("same" groups, each row given by notebook, row number and a piece of
   its text, checked so the registry cannot go stale); every cross-notebook pair from the same source
   document whose claims share at least half of their content words (Jaccard >= 0.5) must be registered,
   as "same" or as "distinct". The rows of a registered "same" group must carry one verdict (holds /
   partly / wrong): only the registered groups are compared. A row whose verdict is "decided in notebook
   NN" (or "see notebook NN", "decided claim by claim in notebook NN's table") must point at a notebook that
   decides that claim (a row of its registered group there, or else a row from the same source whose claim
   shares at least 30% of its words), in the section it names ("§7") if it names one.

Each rule is a function that returns its problems as one-line messages; ``problems(root)`` runs them all.
"""
import ast
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line beside it
import lint_main  # noqa: E402

COURSE_ROOT = Path(__file__).resolve().parents[2]
REGISTRY = Path("docs") / "lint" / "claims.json"  # relative to the course's root
CLAIMS_NOTEBOOKS = {"01", "02", "03", "04", "05"}  # the notebooks that end with a claims table


def notebook_paths(root=COURSE_ROOT):
    return sorted((Path(root) / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def load(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def text_of(value):
    return "".join(value) if isinstance(value, list) else (value or "")


def number_of(path):
    return Path(path).name[:2]


# --- words --------------------------------------------------------------------------------------------------

STOP_WORDS = set("""a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each either else even ever every few for
from further had has have having here how however i if in into is it its itself just let like may might more most
much must my neither no nor not now of off on once one only onto or other our out over own per shall she should
so some such than that the their them then there these they this those through thus to too two under until up
upon us very via was we were what when where whether which while who whom why will with within without would yes
you your""".split())
# The course's words for one idea, folded into one before stemming ("the same" and "identical" say "equal").
SYNONYMS = {word: canonical for canonical, group in {
    "dataparallel": "dp",
    "equal": "same identical equals agree agrees",
    "different": "differ differs apart diverge diverges diverged drift drifts drifted",
    "wait": "waits waiting waited hang hangs hung stuck",
    "end": "ends ended stop stops stopped",
    "raise": "raises raised error errors exception",
    "sum": "sums summed summing",
    "unchanged": "untouched intact",
}.items() for word in group.split()}
WORD = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]*)*")  # drop_last and LOCAL_RANK stay one word
NUMBER = re.compile(r"(?<![\w.])(?<!\de-)\d+(?:\.\d+)?(?!\w)(?!\.\d)")  # 6, 0.63; not fc2's 2 nor 1e-6's 6


def stem(word):
    """A crude stem, enough for "averages"/"averaged", "different"/"differ", "draws"/"draw"."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[: -len(suffix)]
            break
    return word[:6]


def content_words(text):
    """Stems of a text's words of 3 letters or more that are not stop-words. An identifier with an underscore
    (drop_last) is one word, kept whole; trailing digits go (float32 -> float)."""
    text = text.lower().replace("\u2019", "'").replace("'s", " ")
    found = set()
    for word in WORD.findall(text):
        if "_" in word:
            found.add(word)
            continue
        word = re.sub(r"\d+$", "", word)
        word = SYNONYMS.get(word, word)
        if len(word) >= 3 and word not in STOP_WORDS:
            found.add(stem(word))
    return found


def numbers_in(text):
    return set(NUMBER.findall(text))


def tokens(text):
    return content_words(text) | numbers_in(text)


# --- what a reader meets, statement by statement --------------------------------------------------------------

BLOCK_START = re.compile(r"(#+\s|[-*+]\s|\d+\.\s|\||```|<)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
TABLE_RULE = re.compile(r"[|\s:-]+")


def markdown_statements(source):
    """A markdown text as statements: each sentence of its paragraphs and list items, each heading, each table row."""
    blocks, current = [], []
    for line in source.splitlines():
        stripped = line.strip()
        if not stripped or BLOCK_START.match(stripped):
            blocks.append(" ".join(current))
            current = []
        if stripped.startswith(("#", "|")):
            if not TABLE_RULE.fullmatch(stripped):
                blocks.append(stripped)
        elif stripped:
            current.append(stripped)
    blocks.append(" ".join(current))
    return [sentence.strip() for block in blocks for sentence in SENTENCE_END.split(block) if sentence.strip()]


def output_text(output):
    if output.get("output_type") == "stream":
        return text_of(output.get("text"))
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    data = output.get("data", {})
    return text_of(data.get("text/markdown") or data.get("text/plain"))


def cell_statements(cell):
    """(kind, statement) for what a reader of the executed notebook sees in one cell: each sentence of a
    markdown cell; each line of a code cell's source and of its outputs."""
    source = text_of(cell.get("source"))
    if cell.get("cell_type") == "markdown":
        return [("markdown", sentence) for sentence in markdown_statements(source)]
    if cell.get("cell_type") != "code":
        return []
    found = [("code", line.strip()) for line in source.splitlines() if line.strip()]
    for output in cell.get("outputs", []):
        found += [("output", line.strip()) for line in output_text(output).splitlines() if line.strip()]
    return found


def summary_statements(notebook):
    """(cell index, statement) for a notebook's "## Summary" section, up to the next # or ## heading."""
    found, inside = [], False
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        part = []
        for line in text_of(cell["source"]).splitlines():
            if re.match(r"#{1,2}\s", line):
                inside = bool(re.match(r"##\s+Summary\b", line))
            elif inside:
                part.append(line)
        found += [(index, sentence) for sentence in markdown_statements("\n".join(part))]
    return found


# --- rule 1: Predicts ---------------------------------------------------------------------------------------


def predict_calls(cell):
    """(qid, question, options) of every literal predict("NN.slug", "question", [...]) call in a code cell."""
    source = text_of(cell.get("source"))
    if cell.get("cell_type") != "code" or "predict" not in source:
        return []
    python = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "predict" and len(node.args) == 3:
            try:
                qid, question, options = (ast.literal_eval(arg) for arg in node.args)
            except ValueError:
                continue
            calls.append((qid, question, list(options)))
    return calls


def answer_key(question, options, answer):
    """What only the right option says: its content words and numbers, less those of the question and of
    every wrong option."""
    said = tokens(question).union(*(tokens(option) for index, option in enumerate(options) if index != answer))
    return tokens(options[answer]) - said


def needed(key):
    """How many of an answer key's tokens one statement must hold to give the answer away."""
    return max(min(3, len(key)), math.ceil(0.6 * len(key)))


def gives_away(key, statement):
    """The key's tokens a statement holds, when they are enough to give the answer away; else an empty set."""
    if len(key) < 2:
        return set()
    found = key & tokens(statement)
    return found if len(found) >= needed(key) else set()


def is_recall(question):
    return question.lstrip().lower().startswith("recall")


def predicts_with_context(notebook, earlier_summaries=()):
    """For every Predict of a notebook: (qid, question, options, cell index, statements met before it), the
    statements as (where, text): the earlier notebooks' summaries, then this notebook's cells above the
    Predict. A Predict cell shows only its question and options; its revealed answer is not counted (a later
    Predict that builds on an earlier one is the course's progression, not a leak)."""
    met = list(earlier_summaries)
    found = []
    for index, cell in enumerate(notebook["cells"]):
        calls = predict_calls(cell)
        for qid, question, options in calls:
            found.append((qid, question, options, index, list(met)))
        if not calls:
            met += [(f"cell {index} ({kind})", text) for kind, text in cell_statements(cell)]
    return found


def giveaways(notebook, answers, earlier_summaries=()):
    """One line per statement that gives a Predict's answer away before the Predict (Recall Predicts exempt)."""
    problems = []
    for qid, question, options, index, met in predicts_with_context(notebook, earlier_summaries):
        if is_recall(question) or qid not in answers:
            continue
        key = answer_key(question, options, answers[qid]["answer"])
        for where, text in met:
            found = gives_away(key, text)
            if found:
                problems.append(f"{qid} (Predict in cell {index}) is answered by {where}, which holds "
                                f"{sorted(found)} of the answer's {sorted(key)}: {text[:300]!r}")
    return problems


def earlier_summaries_of(path, notebooks):
    """The summary statements of every notebook of `notebooks` before this one, as (where, text)."""
    found = []
    for earlier in notebooks:
        if earlier.name < Path(path).name:
            found += [(f"notebook {number_of(earlier)} summary (cell {index})", text)
                      for index, text in summary_statements(load(earlier))]
    return found


def answers_of(path):
    """notebooks/answers/NN.json of the notebook at `path`, {} when it has none."""
    answers_file = Path(path).parent / "answers" / f"{number_of(path)}.json"
    return load(answers_file) if answers_file.exists() else {}


def notebook_giveaways(path, notebooks):
    """Rule 1 for one notebook file: its giveaways, each naming the file."""
    where = f"{Path(path).parent.name}/{Path(path).name}"
    return [f"{where}: {problem}" for problem in giveaways(load(path), answers_of(path),
                                                           earlier_summaries_of(path, notebooks))]


def answer_keys(notebooks):
    """{qid: answer key} of every Predict of the notebooks that has an answer and is no Recall."""
    keys = {}
    for path in notebooks:
        answers = answers_of(path)
        for cell in load(path)["cells"]:
            for qid, question, options in predict_calls(cell):
                if qid in answers and not is_recall(question):
                    keys[qid] = answer_key(question, options, answers[qid]["answer"])
    return keys


def key_coverage_problems(notebooks):
    """The detector must have something to look for: a key of 2 tokens or more in most Predicts (20 at least)."""
    keys = answer_keys(notebooks)
    checkable = [qid for qid, key in keys.items() if len(key) >= 2]
    if len(keys) >= 20 and len(checkable) >= 0.5 * len(keys):
        return []
    return [f"notebooks/: only {len(checkable)} of {len(keys)} Predicts have an answer key of 2 tokens or more "
            f"(the rest: {sorted(set(keys) - set(checkable))})"]


# --- rule 2: claims tables ------------------------------------------------------------------------------------

VERDICTS = ("holds", "partly", "wrong")
ROW_SOURCES = re.compile(r"\((\d{3}(?:\s*,\s*\d{3})*)\)\s*$")
HEADER_SOURCES = re.compile(r"\((\d{3}(?:\s*,\s*\d{3})*)\)")
# "decided in notebook 01", "see notebook 05 §7", "decided claim by claim in notebook 05's table"
REFERENCE = re.compile(r"\b(?:decided|see)\b[^|*]*?\bnotebooks?\s+(\d\d)\b(?:[^|*§]*?(?:§\s*|section\s+)(\d+))?",
                       re.IGNORECASE)
LOOK_ALIKE = 0.5  # Jaccard of content words from which two rows of the same source must be registered
DECIDES = 0.3  # overlap coefficient from which a target notebook's row counts as deciding a referring row


def table_cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def claim_rows(notebook, number):
    """Every row of a notebook's claims tables (a header with "the source says" and "verdict on torch") as a
    dict: notebook, cell, row (its # column), claim (without its source), sources (document numbers, from the
    row or the header), verdicts (the bold holds / partly / wrong), reference (notebook, section) of a
    "decided in notebook NN [§S]" or "see notebook NN" verdict without a verdict of its own."""
    rows, section = [], None
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        columns = None
        for line in text_of(cell["source"]).splitlines():
            if re.match(r"##\s", line):  # "## 8. What the sources say": section 8; "## Summary": none
                section = (re.match(r"##\s+(\d+)\.", line) or [None, None])[1]
            if not line.strip().startswith("|"):
                columns = None
                continue
            cells = table_cells(line)
            lowered = [c.lower() for c in cells]
            if any("the source says" in c for c in lowered) and any("verdict on torch" in c for c in lowered):
                columns = (next(i for i, c in enumerate(lowered) if "the source says" in c),
                           next(i for i, c in enumerate(lowered) if "verdict on torch" in c))
                header_sources = HEADER_SOURCES.findall(cells[columns[0]])
                continue
            if columns is None or TABLE_RULE.fullmatch(line.strip()) or len(cells) <= max(columns):
                continue
            claim, verdict = cells[columns[0]], cells[columns[1]]
            found = ROW_SOURCES.findall(claim) or header_sources
            bold = [re.sub(r"[^a-z ]+", " ", b.lower()).split() for b in re.findall(r"\*\*(.+?)\*\*", verdict)]
            verdicts = {words[0] for words in bold if words and words[0] in VERDICTS}
            reference = REFERENCE.search(verdict)
            rows.append({
                "notebook": number, "cell": index, "section": section,
                "row": int(cells[0]) if cells[0].isdigit() else cells[0],
                "claim": ROW_SOURCES.sub("", claim).strip(),
                "sources": {s.strip() for group in found for s in group.split(",")},
                "verdicts": verdicts,
                "reference": (reference.group(1), reference.group(2)) if reference and not verdicts else None,
            })
    return rows


def course_claims(notebooks):
    rows = []
    for path in notebooks:
        rows += claim_rows(load(path), number_of(path))
    return rows


def claim_words(row):
    return content_words(re.sub(r"^Ex\.\s*\d+:", "", row["claim"]))


def jaccard(a, b):
    return len(a & b) / len(a | b) if a | b else 0.0


def overlap(a, b):
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def name(row):
    return f"notebook {row['notebook']} row {row['row']}"


def describe(row):
    verdict = "/".join(sorted(row["verdicts"])) or (f"decided in notebook {row['reference'][0]}"
                                                    if row["reference"] else "no verdict")
    return f"{name(row)} ({verdict}): {row['claim'][:100]!r}"


def key_of(row):
    return row["notebook"], row["row"]


def rows_without_source_or_verdict(rows, expected=CLAIMS_NOTEBOOKS):
    """A notebook of `expected` without a claims table; a row without a source document or a verdict."""
    problems = [f"notebook {number}: no claims table (a header with 'the source says' and 'verdict on torch')"
                for number in sorted(expected - {row["notebook"] for row in rows})]
    return problems + [f"{describe(row)} has no source document or no verdict (sources {sorted(row['sources'])})"
                       for row in rows if not row["sources"] or not (row["verdicts"] or row["reference"])]


def load_registry(path):
    return load(path) if Path(path).exists() else {}


def resolve(reference, rows):
    """The row a registry entry [notebook, row, text] names, or a message saying why it is stale."""
    notebook, number, text = reference
    wanted = " ".join(text.lower().split())
    row = next((r for r in rows if r["notebook"] == notebook and r["row"] == number), None)
    if row is not None and wanted in " ".join(row["claim"].lower().split()):
        return row, None
    moved = [r for r in rows if r["notebook"] == notebook and wanted in " ".join(r["claim"].lower().split())]
    where = f"; that text is now in {name(moved[0])}" if moved else ""
    now = f" (it reads {row['claim'][:100]!r})" if row else " (no such row)"
    return None, f"{REGISTRY.as_posix()} names notebook {notebook} row {number} as {text!r}{now}{where}"


def registered_groups(registry, rows):
    """(same groups, distinct pairs, stale entries): the registry's entries resolved to rows."""
    stale, resolved = [], {}
    for kind in ("same", "distinct"):
        resolved[kind] = []
        for entry in registry.get(kind, []):
            group = []
            for reference in entry["rows"]:
                row, problem = resolve(reference, rows)
                stale += [problem] if problem else []
                group += [row] if row else []
            resolved[kind].append(group)
    return resolved["same"], resolved["distinct"], stale


def look_alike_pairs(rows, threshold=LOOK_ALIKE):
    """Rows of two notebooks from a common source document whose claims share most of their content words."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["notebook"] != b["notebook"] and a["sources"] & b["sources"]:
                if jaccard(claim_words(a), claim_words(b)) >= threshold:
                    pairs.append((a, b))
    return pairs


def unregistered_look_alikes(rows, same, distinct):
    """One line per look-alike pair that the registry names neither as the same claim nor as distinct."""
    known = set()
    for group in same + distinct:
        known |= {frozenset((key_of(a), key_of(b))) for a in group for b in group if a is not b}
    return [f"{describe(a)} and {describe(b)} look alike (Jaccard {jaccard(claim_words(a), claim_words(b)):.2f}): "
            f"register the pair in {REGISTRY.as_posix()} as 'same' or 'distinct'"
            for a, b in look_alike_pairs(rows) if frozenset((key_of(a), key_of(b))) not in known]


def verdict_conflicts(same):
    """One line per registered "same" group (one claim) whose rows' verdicts differ; only the registered
    groups are compared (an unregistered look-alike pair is unregistered_look_alikes's)."""
    problems = []
    for group in same:
        decided = [row for row in group if row["verdicts"]]
        if len({frozenset(row["verdicts"]) for row in decided}) > 1:
            problems.append("the same claim has different verdicts: " + "; ".join(map(describe, decided)))
    return problems


def reference_problems(rows, same):
    """A "decided in notebook NN [§S]" row must point at a notebook that decides the claim: a row of the same
    registered group in NN with a verdict, or (unregistered) a row of NN from a common source with a verdict
    whose claim overlaps. With §S, those rows must be in NN's section S."""
    problems = []
    for row in rows:
        if not row["reference"]:
            continue
        target, section = row["reference"]
        group = next((g for g in same if any(key_of(r) == key_of(row) for r in g)), None)
        if group is not None:
            deciders = [r for r in group if r["notebook"] == target and r["verdicts"]]
        else:
            deciders = [r for r in rows if r["notebook"] == target and r["verdicts"] and r["sources"] & row["sources"]
                        and overlap(claim_words(r), claim_words(row)) >= DECIDES]
        if not deciders:
            problems.append(f"{describe(row)} points at notebook {target}, which has no row deciding this claim")
        elif section:
            sections = {r["section"] for r in deciders}
            if section not in sections:
                problems.append(f"{describe(row)} points at notebook {target} section {section}; its claims "
                                f"table is in section {', '.join(sorted(s or '?' for s in sections))}")
    return problems


def claims_problems(root=COURSE_ROOT):
    """Rule 2 on the course at `root`: sources and verdicts, the registry, look-alikes, conflicts, references."""
    rows = course_claims(notebook_paths(root))
    same, distinct, stale = registered_groups(load_registry(Path(root) / REGISTRY), rows)
    return (rows_without_source_or_verdict(rows) + stale + unregistered_look_alikes(rows, same, distinct)
            + verdict_conflicts(same) + reference_problems(rows, same))


def problems(root=COURSE_ROOT):
    """Every problem of both rules on the course at `root`, one line each."""
    notebooks = notebook_paths(root)
    found = [problem for path in notebooks for problem in notebook_giveaways(path, notebooks)]
    return found + key_coverage_problems(notebooks) + claims_problems(root)


def _summary(root):
    """The one line said when nothing is wrong."""
    notebooks = notebook_paths(root)
    return (f"course truth ok: {len(answer_keys(notebooks))} Predicts (Recall ones aside) not answered above themselves, "
            f"{len(course_claims(notebooks))} claims rows with one verdict per registered claim")


def main(argv=None):
    return lint_main.check(__doc__, problems, _summary, COURSE_ROOT, argv)


if __name__ == "__main__":
    sys.exit(main())
