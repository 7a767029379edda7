"""The course tells things in the right order and only once (docs/lint/course_truth.py, whose docstring
states the rules): on the committed notebooks no Predict is answered above itself, most Predicts have an
answer key to look for, and the claims tables carry one verdict per registered claim; and each rule reports
a defect planted in a synthetic notebook. Pure parsing: no kernel, no launch.
"""
import pytest

from helpers import docs_tool

lint = docs_tool("docs/lint/course_truth.py")
NOTEBOOKS = lint.notebook_paths()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lint.number_of)
def test_no_predict_is_answered_above_itself(path):
    problems = lint.notebook_giveaways(path, NOTEBOOKS)
    assert not problems, ("a Predict's answer is stated before the Predict (move or reword the statement, or "
                          "start the question with 'Recall' if it asks for what was taught):\n" + "\n".join(problems))


def test_most_predicts_have_an_answer_key_to_look_for():
    """The detector must have something to look for: a key of 2 tokens or more in most Predicts."""
    assert lint.key_coverage_problems(NOTEBOOKS) == []


def synthetic_notebook(*cells):
    """A notebook from ("md", text) and ("code", source) pairs."""
    return {"cells": [{"cell_type": "markdown" if kind == "md" else "code", "source": text,
                       **({"outputs": []} if kind == "code" else {})} for kind, text in cells]}


PLANTED_PREDICT = ('predict("99.scatter", "Two ranks call gather with dst=0. What does rank 1 receive?",\n'
                   '        ["the full list, like rank 0", "nothing: only the destination rank gets the list",\n'
                   '         "half of the list"])')
PLANTED_ANSWERS = {"99.scatter": {"answer": 1, "why": "gather delivers the list to dst only."}}


def test_detector_flags_an_answer_planted_above_its_predict():
    """The planted answer is reported from a markdown sentence, from a code cell's output and from an earlier
    notebook's summary."""
    key = lint.answer_key(*lint.predict_calls(synthetic_notebook(("code", PLANTED_PREDICT))["cells"][0])[0][1:],
                          PLANTED_ANSWERS["99.scatter"]["answer"])
    assert key == {"noth", "destin", "gets"}  # "list" and "rank" are in the question or a wrong option
    planted = synthetic_notebook(("md", "## 3. Gather\n\nCollectives move tensors. Only the destination rank\n"
                                        "gets anything; the others get nothing back."),
                                 ("code", PLANTED_PREDICT))
    problems = lint.giveaways(planted, PLANTED_ANSWERS)
    assert len(problems) == 1 and "99.scatter (Predict in cell 1) is answered by cell 0 (markdown)" in problems[0]
    assert "Only the destination rank gets anything" in problems[0]

    in_an_output = synthetic_notebook(("code", "print(result)"), ("code", PLANTED_PREDICT))
    in_an_output["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                            "text": ["rank 1 gets nothing: not the destination\n"]}]
    assert len(lint.giveaways(in_an_output, PLANTED_ANSWERS)) == 1

    in_a_summary = [("notebook 98 summary (cell 40)", "Only the destination of gather gets the list, others nothing.")]
    assert len(lint.giveaways(synthetic_notebook(("code", PLANTED_PREDICT)), PLANTED_ANSWERS, in_a_summary)) == 1


def test_detector_accepts_an_answer_after_its_predict_and_a_recall_predict():
    clean = synthetic_notebook(("md", "## 3. Gather\n\n`dist.gather` collects one tensor from every rank. "
                                      "Which ranks get the list? Predict first:"),
                               ("code", PLANTED_PREDICT),
                               ("md", "Only the destination rank gets the list; the others get nothing."))
    assert lint.giveaways(clean, PLANTED_ANSWERS) == []  # the answer comes after the Predict: fine
    recall = synthetic_notebook(("md", "Only the destination rank gets anything; the others get nothing."),
                                ("code", PLANTED_PREDICT.replace('"Two ranks', '"Recall: two ranks')))
    assert lint.giveaways(recall, {"99.scatter": PLANTED_ANSWERS["99.scatter"]}) == []


def test_distinctive_numbers_count_but_a_number_alone_does_not():
    question, options = "Checkpoints every 3 steps; rank 1 dies after step 7. Where does training resume?", [
        "at step 0: a fresh start", "at step 7, where it stopped", "at step 6, the last checkpoint"]
    key = lint.answer_key(question, options, 2)
    assert key == {"6", "last"}
    assert lint.gives_away(key, "The restart resumes at step 6 from the last checkpoint.")
    assert not lint.gives_away(key, "6 ranks ran here.") and not lint.gives_away(key, "the last line; 1e-6")
    assert not lint.gives_away(key, "drop_last shards: [[0, 3, 6], [1, 4, 7]]")  # drop_last is not "last"
    steps = lint.answer_key("PeriodicModelAverager(period=4): after which steps does it average?",
                            ["after steps 4, 8, 12, 16", "after steps 1, 5, 9, 13", "after step 4 only"], 1)
    assert steps == {"1", "5", "9", "13"}
    assert lint.gives_away(steps, "It averages after steps 1, 5 and 9.") == {"1", "5", "9"}
    assert not lint.gives_away(steps, "It averages after steps 4, 8 and 12; step 1 is local.")


# --- claims tables --------------------------------------------------------------------------------------------

def course_rows_and_groups():
    rows = lint.course_claims(NOTEBOOKS)
    return (rows, *lint.registered_groups(lint.load_registry(lint.COURSE_ROOT / lint.REGISTRY), rows))


def test_every_claim_row_has_a_source_and_a_verdict():
    problems = lint.rows_without_source_or_verdict(lint.course_claims(NOTEBOOKS))
    assert not problems, "\n".join(problems)


def test_claims_registry_points_at_rows_that_still_say_it():
    _, _, _, stale = course_rows_and_groups()
    assert not stale, "update docs/lint/claims.json:\n" + "\n".join(stale)


def test_every_look_alike_claim_pair_is_registered():
    rows, same, distinct, _ = course_rows_and_groups()
    problems = lint.unregistered_look_alikes(rows, same, distinct)
    assert not problems, "claims of two notebooks that look alike:\n" + "\n".join(problems)


def test_each_registered_same_claim_group_carries_one_verdict():
    """Compares the registered groups only (docs/lint/claims.json's "same" groups): the rows the registry
    names as one claim carry one verdict. A look-alike pair that is not registered is not compared here; it
    fails test_every_look_alike_claim_pair_is_registered."""
    _, same, _, _ = course_rows_and_groups()
    problems = lint.verdict_conflicts(same)
    assert not problems, "\n".join(problems)


def test_decided_elsewhere_points_at_a_verdict():
    rows, same, _, _ = course_rows_and_groups()
    problems = lint.reference_problems(rows, same)
    assert not problems, "\n".join(problems)


def claims_table(source_column, *rows, section=None):
    """A markdown claims table (a synthetic notebook's cell) from (row, claim, verdict) triples."""
    lines = ([f"## {section}. The sources, tested", ""] if section else []) + [
        f"| # | the source says {source_column} | verdict on torch 2.13 | evidence | run |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {n} | {claim} | {verdict} | section 1 | run here |" for n, claim, verdict in rows])


def synthetic_claims(number, *rows, section=None):
    return lint.claim_rows(synthetic_notebook(("md", claims_table("(NNN)", *rows, section=section))), number)


def test_claims_rules_report_a_planted_conflict_look_alike_stale_entry_and_bad_reference():
    """Synthetic claims tables: a registered "same" group with two verdicts is a conflict (one verdict: none);
    an unregistered look-alike pair, a registry entry whose row says something else, a "decided in notebook
    01" that 01 does not decide, and a "§7" where the deciding table is in §6 are each reported."""
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
    same, distinct, stale = lint.registered_groups(plan, rows)
    assert stale == [] and lint.unregistered_look_alikes(rows, same, distinct) == []
    conflicts = lint.verdict_conflicts(same)
    assert len(conflicts) == 1
    assert "notebook 01 row 1 (partly)" in conflicts[0] and "notebook 05 row 7 (holds)" in conflicts[0]
    second[0]["verdicts"] = {"partly"}
    assert lint.verdict_conflicts(same) == []

    # a look-alike pair left out of the registry fails; a registry entry whose row changed is stale
    assert len(lint.unregistered_look_alikes(rows, [], distinct)) == 1
    _, _, stale = lint.registered_groups({"same": [{"rows": [["01", 2, "trades efficiency"]]}]}, rows)
    assert stale and "that text is now in notebook 01 row 1" in stale[0]

    # "decided in notebook 01": 01 must decide the claim; here it does not (no row about averaging gradients)
    problems = lint.reference_problems(rows, same)
    assert len(problems) == 1 and "notebook 05 row 9" in problems[0] and "no row deciding this claim" in problems[0]
    deciding = synthetic_claims("01", (3, "DP averages the gradients on the primary GPU (003)", "**wrong**: summed"),
                                section=6)
    assert deciding[0]["section"] == "6"
    assert lint.reference_problems(rows + deciding, same) == []
    second[2]["reference"] = ("01", "7")  # "see notebook 01 §7", but 01 decides the claim in its section 6
    problems = lint.reference_problems(rows + deciding, same)
    assert len(problems) == 1 and "section 7; its claims table is in section 6" in problems[0]
