"""The course tells things in the right order and only once: no Predict is answered above itself, and no
source claim gets two different verdicts in two notebooks.

Pure parsing of the committed, executed notebooks (notebooks/NN_*.ipynb, outputs included), of
notebooks/answers/NN.json and of tests/claims.json: no kernel, no launch.

1. Questions before answers. A Predict's *answer key* is what only its right option says: the option's
   content words (crudely stemmed; stop-words and words under 3 letters dropped; identifiers such as
   drop_last kept whole; a few of the course's synonyms folded: "same"/"identical" -> "equal", "hang"/"stuck"
   -> "wait", "DP" -> "DataParallel", ...) and its numbers, less every word and number of the question and
   of the wrong options. A statement met before the Predict (a sentence, heading or table row of a markdown
   cell, a line of a code cell or of its outputs, or a sentence of an earlier notebook's "## Summary")
   gives the answer away when it holds at least 60% of the key and at least 3 of its tokens (both, for a
   key of 2): a number counts as one token, so a distinctive number gives the answer away together with the
   option's words, never alone ("6" alone is everywhere). A Predict whose question starts with "Recall" asks
   for what was taught before and is exempt. A key of one token is no evidence: the test that most
   Predicts have a key of 2 or more keeps the detector from passing by having nothing to look for. What it
   cannot see: an answer stated in other words (a table row "one per process: no contention" for "the
   threads take turns"); a reviewer still reads the lead-ins.
2. One verdict per claim. Notebooks 01-05 end with claims tables (columns "the source says" and "verdict on
   torch 2.13"). Rows of two notebooks are the same claim when tests/claims.json says so ("same" groups,
   each row given by notebook, row number and a piece of its text, checked so the registry cannot go
   stale); every cross-notebook pair from the same source document whose claims share at least half of
   their content words (Jaccard >= 0.5) must be registered, as "same" or as "distinct". The rows of a "same"
   group must carry one verdict (holds / partly / wrong), and a row whose verdict is "decided in notebook NN"
   (or "see notebook NN", "decided claim by claim in notebook NN's table") must point at a notebook that
   decides that claim (a row of its registered group there, or else a row from the same source whose claim
   shares at least 30% of its words), in the section it names ("§7") if it names one.
"""
import ast
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ANSWERS = ROOT / "notebooks" / "answers"
REGISTRY = Path(__file__).with_name("claims.json")


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


# --- Predicts -----------------------------------------------------------------------------------------------


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


def predicts_with_context(notebook, answers, earlier_summaries=()):
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
    for qid, question, options, index, met in predicts_with_context(notebook, answers, earlier_summaries):
        if is_recall(question) or qid not in answers:
            continue
        key = answer_key(question, options, answers[qid]["answer"])
        for where, text in met:
            found = gives_away(key, text)
            if found:
                problems.append(f"{qid} (Predict in cell {index}) is answered by {where}, which holds "
                                f"{sorted(found)} of the answer's {sorted(key)}:\n    {text[:300]!r}")
    return problems


def earlier_summaries_of(path):
    """The summary statements of every notebook before this one, as (where, text)."""
    found = []
    for earlier in NOTEBOOKS:
        if earlier.name < path.name:
            found += [(f"notebook {number_of(earlier)} summary (cell {index})", text)
                      for index, text in summary_statements(load(earlier))]
    return found


def answers_of(path):
    answers_file = ANSWERS / f"{number_of(path)}.json"
    return load(answers_file) if answers_file.exists() else {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=number_of)
def test_no_predict_is_answered_above_itself(path):
    problems = giveaways(load(path), answers_of(path), earlier_summaries_of(path))
    assert not problems, (f"{path.name}: a Predict's answer is stated before the Predict (move or reword the "
                          "statement, or start the question with 'Recall' if it asks for what was taught):\n"
                          + "\n".join(problems))


def test_most_predicts_have_an_answer_key_to_look_for():
    """The detector must have something to look for: a key of 2 tokens or more in most Predicts."""
    keys = {}
    for path in NOTEBOOKS:
        answers = answers_of(path)
        for cell in load(path)["cells"]:
            for qid, question, options in predict_calls(cell):
                if qid in answers and not is_recall(question):
                    keys[qid] = answer_key(question, options, answers[qid]["answer"])
    checkable = [qid for qid, key in keys.items() if len(key) >= 2]
    assert len(keys) >= 20 and len(checkable) >= 0.5 * len(keys), (
        f"only {len(checkable)} of {len(keys)} Predicts have an answer key of 2 tokens or more: "
        f"{sorted(set(keys) - set(checkable))}")


def synthetic_notebook(*cells):
    """A notebook from ("md", text) and ("code", source) pairs."""
    return {"cells": [{"cell_type": "markdown" if kind == "md" else "code", "source": text,
                       **({"outputs": []} if kind == "code" else {})} for kind, text in cells]}


PLANTED_PREDICT = ('predict("99.scatter", "Two ranks call gather with dst=0. What does rank 1 receive?",\n'
                   '        ["the full list, like rank 0", "nothing: only the destination rank gets the list",\n'
                   '         "half of the list"])')
PLANTED_ANSWERS = {"99.scatter": {"answer": 1, "why": "gather delivers the list to dst only."}}


def test_detector_flags_an_answer_planted_above_its_predict():
    key = answer_key(*predict_calls(synthetic_notebook(("code", PLANTED_PREDICT))["cells"][0])[0][1:],
                     PLANTED_ANSWERS["99.scatter"]["answer"])
    assert key == {"noth", "destin", "gets"}  # "list" and "rank" are in the question or a wrong option
    planted = synthetic_notebook(("md", "## 3. Gather\n\nCollectives move tensors. Only the destination rank\n"
                                        "gets anything; the others get nothing back."),
                                 ("code", PLANTED_PREDICT))
    problems = giveaways(planted, PLANTED_ANSWERS)
    assert len(problems) == 1 and "99.scatter (Predict in cell 1) is answered by cell 0 (markdown)" in problems[0]
    assert "Only the destination rank gets anything" in problems[0]

    in_an_output = synthetic_notebook(("code", "print(result)"), ("code", PLANTED_PREDICT))
    in_an_output["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                            "text": ["rank 1 gets nothing: not the destination\n"]}]
    assert len(giveaways(in_an_output, PLANTED_ANSWERS)) == 1

    in_a_summary = [("notebook 98 summary (cell 40)", "Only the destination of gather gets the list, others nothing.")]
    assert len(giveaways(synthetic_notebook(("code", PLANTED_PREDICT)), PLANTED_ANSWERS, in_a_summary)) == 1


def test_detector_accepts_a_clean_notebook():
    clean = synthetic_notebook(("md", "## 3. Gather\n\n`dist.gather` collects one tensor from every rank. "
                                      "Which ranks get the list? Predict first:"),
                               ("code", PLANTED_PREDICT),
                               ("md", "Only the destination rank gets the list; the others get nothing."))
    assert giveaways(clean, PLANTED_ANSWERS) == []  # the answer comes after the Predict: fine
    recall = synthetic_notebook(("md", "Only the destination rank gets anything; the others get nothing."),
                                ("code", PLANTED_PREDICT.replace('"Two ranks', '"Recall: two ranks')))
    assert giveaways(recall, {"99.scatter": PLANTED_ANSWERS["99.scatter"]}) == []


def test_distinctive_numbers_count_but_a_number_alone_does_not():
    question, options = "Checkpoints every 3 steps; rank 1 dies after step 7. Where does training resume?", [
        "at step 0: a fresh start", "at step 7, where it stopped", "at step 6, the last checkpoint"]
    key = answer_key(question, options, 2)
    assert key == {"6", "last"}
    assert gives_away(key, "The restart resumes at step 6 from the last checkpoint.")
    assert not gives_away(key, "6 ranks ran here.") and not gives_away(key, "the last line; 1e-6")
    assert not gives_away(key, "drop_last shards: [[0, 3, 6], [1, 4, 7]]")  # drop_last is not "last"
    steps = answer_key("PeriodicModelAverager(period=4): after which steps does it average?",
                       ["after steps 4, 8, 12, 16", "after steps 1, 5, 9, 13", "after step 4 only"], 1)
    assert steps == {"1", "5", "9", "13"}
    assert gives_away(steps, "It averages after steps 1, 5 and 9.") == {"1", "5", "9"}
    assert not gives_away(steps, "It averages after steps 4, 8 and 12; step 1 is local.")



# --- claims tables --------------------------------------------------------------------------------------------

VERDICTS = ("holds", "partly", "wrong")
ROW_SOURCES = re.compile(r"\((\d{3}(?:\s*,\s*\d{3})*)\)\s*$")
HEADER_SOURCES = re.compile(r"\((\d{3}(?:\s*,\s*\d{3})*)\)")
# "decided in notebook 01", "see notebook 05 §7", "decided claim by claim in notebook 05's table"
REFERENCE = re.compile(r"\b(?:decided|see)\b[^|*]*?\bnotebooks?\s+(\d\d)\b(?:[^|*§]*?(?:§\s*|section\s+)(\d+))?",
                       re.IGNORECASE)


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


def course_claims():
    rows = []
    for path in NOTEBOOKS:
        rows += claim_rows(load(path), number_of(path))
    return rows


def claim_words(row):
    return content_words(re.sub(r"^Ex\.\s*\d+:", "", row["claim"]))


def jaccard(a, b):
    return len(a & b) / len(a | b) if a | b else 0.0


def overlap(a, b):
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


LOOK_ALIKE = 0.5  # Jaccard of content words from which two rows of the same source must be registered
DECIDES = 0.3  # overlap coefficient from which a target notebook's row counts as deciding a referring row


def name(row):
    return f"notebook {row['notebook']} row {row['row']}"


def describe(row):
    verdict = "/".join(sorted(row["verdicts"])) or (f"decided in notebook {row['reference'][0]}"
                                                    if row["reference"] else "no verdict")
    return f"{name(row)} ({verdict}): {row['claim'][:100]!r}"


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
    return None, f"tests/claims.json names notebook {notebook} row {number} as {text!r}{now}{where}"


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


def key_of(row):
    return row["notebook"], row["row"]


def unregistered_look_alikes(rows, same, distinct):
    known = set()
    for group in same + distinct:
        known |= {frozenset((key_of(a), key_of(b))) for a in group for b in group if a is not b}
    return [f"{describe(a)}\n    {describe(b)}\n    (Jaccard {jaccard(claim_words(a), claim_words(b)):.2f}: "
            f"register the pair in tests/claims.json as 'same' or 'distinct')"
            for a, b in look_alike_pairs(rows) if frozenset((key_of(a), key_of(b))) not in known]


def verdict_conflicts(same):
    """One message per group of rows (the same claim) whose verdicts differ."""
    problems = []
    for group in same:
        decided = [row for row in group if row["verdicts"]]
        if len({frozenset(row["verdicts"]) for row in decided}) > 1:
            problems.append("the same claim has different verdicts:\n    " + "\n    ".join(map(describe, decided)))
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
            problems.append(f"{describe(row)}\n    points at notebook {target}, which has no row deciding this claim")
        elif section:
            sections = {r["section"] for r in deciders}
            if section not in sections:
                problems.append(f"{describe(row)}\n    points at notebook {target} section {section}; its claims "
                                f"table is in section {', '.join(sorted(s or '?' for s in sections))}")
    return problems


def registry():
    return load(REGISTRY) if REGISTRY.exists() else {}


def test_every_claim_row_has_a_source_and_a_verdict():
    rows = course_claims()
    assert {row["notebook"] for row in rows} >= {"01", "02", "03", "04", "05"}, "a claims table is missing"
    bad = [describe(row) + f" (sources {sorted(row['sources'])})" for row in rows
           if not row["sources"] or not (row["verdicts"] or row["reference"])]
    assert not bad, "claims rows without a source document or a verdict:\n" + "\n".join(bad)


def test_claims_registry_points_at_rows_that_still_say_it():
    _, _, stale = registered_groups(registry(), course_claims())
    assert not stale, "update tests/claims.json:\n" + "\n".join(stale)


def test_every_look_alike_claim_pair_is_registered():
    rows = course_claims()
    same, distinct, _ = registered_groups(registry(), rows)
    problems = unregistered_look_alikes(rows, same, distinct)
    assert not problems, "claims of two notebooks that look alike:\n" + "\n".join(problems)


def test_registered_look_alike_claims_share_one_verdict():
    """Compares the registered groups only (tests/claims.json): claims the registry groups as one must carry
    the same verdict; a look-alike pair not registered is caught by test_every_look_alike_claim_pair_is_registered."""
    same, _, _ = registered_groups(registry(), course_claims())
    problems = verdict_conflicts(same)
    assert not problems, "\n".join(problems)


def test_decided_elsewhere_points_at_a_verdict():
    rows = course_claims()
    same, _, _ = registered_groups(registry(), rows)
    problems = reference_problems(rows, same)
    assert not problems, "\n".join(problems)


def claims_table(source_column, *rows, section=None):
    """A markdown claims table (a synthetic notebook's cell) from (row, claim, verdict) triples."""
    lines = ([f"## {section}. The sources, tested", ""] if section else []) + [
        f"| # | the source says {source_column} | verdict on torch 2.13 | evidence | run |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {n} | {claim} | {verdict} | section 1 | run here |" for n, claim, verdict in rows])


def synthetic_claims(number, *rows, section=None):
    return claim_rows(synthetic_notebook(("md", claims_table("(NNN)", *rows, section=section))), number)


def test_claim_comparison_fails_on_a_planted_conflict():
    first = synthetic_claims("01", (1, "scaling over many devices trades efficiency against accuracy (003)",
                                    "**partly**: the global batch grows"),
                             (2, "DDP is recommended even on one node (003)", "**holds**"))
    second = synthetic_claims("05", (7, "Scaling SGD over many devices trades efficiency against accuracy (003)",
                                     "**holds**: more ranks, higher loss"),
                              (8, "DDP runs on one node and on many (003)", "**holds**"),
                              (9, "DP averages the replicas' gradients (003)", "decided in notebook 01"))
    rows = first + second
    assert [r["sources"] for r in rows] == [{"003"}] * 5 and rows[4]["reference"] == ("01", None)
    plan = {"same": [{"rows": [["01", 1, "trades efficiency"], ["05", 7, "trades efficiency against"]]}],
            "distinct": [{"rows": [["01", 2, "recommended"], ["05", 8, "runs on one node"]]}]}
    same, distinct, stale = registered_groups(plan, rows)
    assert stale == [] and unregistered_look_alikes(rows, same, distinct) == []
    conflicts = verdict_conflicts(same)
    assert len(conflicts) == 1
    assert "notebook 01 row 1 (partly)" in conflicts[0] and "notebook 05 row 7 (holds)" in conflicts[0]
    second[0]["verdicts"] = {"partly"}
    assert verdict_conflicts(same) == []

    # a look-alike pair left out of the registry fails; a registry entry whose row changed is stale
    assert len(unregistered_look_alikes(rows, [], distinct)) == 1
    _, _, stale = registered_groups({"same": [{"rows": [["01", 2, "trades efficiency"]]}]}, rows)
    assert stale and "that text is now in notebook 01 row 1" in stale[0]

    # "decided in notebook 01": 01 must decide the claim; here it does not (no row about averaging gradients)
    problems = reference_problems(rows, same)
    assert len(problems) == 1 and "notebook 05 row 9" in problems[0] and "no row deciding this claim" in problems[0]
    deciding = synthetic_claims("01", (3, "DP averages the gradients on the primary GPU (003)", "**wrong**: summed"),
                                section=6)
    assert deciding[0]["section"] == "6"
    assert reference_problems(rows + deciding, same) == []
    second[2]["reference"] = ("01", "7")  # "see notebook 01 §7", but 01 decides the claim in its section 6
    problems = reference_problems(rows + deciding, same)
    assert len(problems) == 1 and "section 7; its claims table is in section 6" in problems[0]
