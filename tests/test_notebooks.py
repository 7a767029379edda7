"""The notebooks as files: clean learner copies, saved-file hygiene, Predicts, outputs every laptop reproduces.

No kernel runs here (tests/test_learner_path.py runs the lab cells as a learner would).
"""
import ast
import collections
import copy
import importlib.metadata
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbval.plugin import coalesce_streams, find_comment_markers, get_sanitize_patterns

from ddpcourse.authoring import notebooks as nbfiles
from ddpcourse.paths import COURSE_ROOT, lab_files
from ddpcourse.learner.quiz import ANSWERS_FOLDER, plain_text

NOTEBOOKS = nbfiles.notebook_files()
CLEAN = nbfiles.notebook_files(nbfiles.CLEAN)
SANITIZE = get_sanitize_patterns((COURSE_ROOT / "tests" / "nbval_sanitize.cfg").read_text())


def read(path):
    return nbformat.read(path, as_version=4)


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def python_of(cell):
    """A code cell as plain Python (IPython's %magics and !commands turned into calls)."""
    return TransformerManager().transform_cell(cell.source)


def test_there_is_one_notebook_per_lab():
    """The parametrized tests below run over NOTEBOOKS: it must hold every module's notebook, one per lab."""
    numbers = [p.name[:2] for p in NOTEBOOKS]
    labs = [p.name[:2] for p in lab_files(COURSE_ROOT / "solutions")]
    assert numbers == labs, f"notebooks {numbers}, labs {labs}"
    assert NOTEBOOKS == sorted((COURSE_ROOT / "notebooks").glob("*.ipynb"))  # none left out by the pattern


# --- clean/ copies -------------------------------------------------------------------------------------------


def test_clean_copies_are_up_to_date():
    assert [p.name for p in CLEAN] == [p.name for p in NOTEBOOKS], "run `python -m ddpcourse make-clean`"
    assert nbfiles.make_clean(check=True) == [], "run `python -m ddpcourse make-clean`"


def test_clean_copies_hold_no_results():
    for path in CLEAN:
        notebook = read(path)
        assert "widgets" not in notebook.metadata, path.name
        for cell in code_cells(notebook):
            assert cell.outputs == [] and cell.execution_count is None, (path.name, cell.source[:60])
            assert not set(cell.metadata) & set(nbfiles.RUN_METADATA), (path.name, cell.source[:60])


def test_drift_check_ignores_a_learners_run_but_not_an_edit(tmp_path, monkeypatch):
    notebook = NOTEBOOKS[0]
    monkeypatch.setattr(nbfiles, "CLEAN", tmp_path)
    nbfiles.make_clean(paths=[notebook])
    learner_copy = read(tmp_path / notebook.name)
    for number, cell in enumerate(code_cells(learner_copy), start=1):  # what Run All and Save write
        cell.execution_count = number
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="learner's output\n")]
        cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    learner_copy.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(learner_copy, tmp_path / notebook.name)
    assert nbfiles.make_clean(check=True, paths=[notebook]) == []

    code_cells(learner_copy)[-1].source += "\nprint('edited')"
    nbformat.write(learner_copy, tmp_path / notebook.name)
    assert nbfiles.make_clean(check=True, paths=[notebook]) == [tmp_path / notebook.name]


def relative_links(notebook):
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for _, target in nbfiles.LINK.findall(cell.source):
                if not re.match(r"^([a-z]+:|#)", target):
                    yield target.split("#")[0]


def test_every_link_of_a_clean_copy_resolves():
    links = 0
    for path in CLEAN:
        for target in relative_links(read(path)):
            links += 1
            assert (path.parent / target).is_file(), f"{path.name}: {target} does not resolve from clean/"
    assert links >= len(CLEAN)  # every notebook shows at least one figure


def test_clean_link_rewriting():
    source = "![a](figures/x.svg) [next](01_dataparallel_vs_ddp.ipynb) [web](https://pytorch.org) <img src=\"figures/y.svg\">"
    rewritten = nbfiles.LINK.sub(nbfiles._link_from_clean, source)
    assert rewritten == ("![a](../notebooks/figures/x.svg) [next](01_dataparallel_vs_ddp.ipynb) "
                         "[web](https://pytorch.org) <img src=\"../notebooks/figures/y.svg\">")


def test_pytest_does_not_collect_clean_copies(pytestconfig):
    ignored = pytestconfig.hook.pytest_ignore_collect(collection_path=COURSE_ROOT / "clean", config=pytestconfig)
    assert ignored is True


# --- the committed, executed notebooks ---------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_notebook_carries_no_run_state(path):
    """No widget state, per-cell timing or frozen widget views (saved mid-run); execution counts stay."""
    notebook = read(path)
    assert "widgets" not in notebook.metadata, f"{path.name}: re-execute with `python -m ddpcourse execute`"
    for cell in code_cells(notebook):
        where = f"{path.name}, cell {cell.source.splitlines()[0] if cell.source else ''!r}"
        assert not set(cell.metadata) & set(nbfiles.RUN_METADATA), where
        assert isinstance(cell.execution_count, int), where
        assert not any(nbfiles.WIDGET_VIEW in output.get("data", {}) for output in cell.outputs), where


def test_strip_run_state_keeps_only_final_text():
    notebook = nbformat.v4.new_notebook(metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}})
    cell = nbformat.v4.new_code_cell("run_lab('demos/x.py')", execution_count=3,
                                     metadata={"execution": {"iopub.status.busy": "2026-01-01T00:00:00Z"}})
    cell.outputs = [nbformat.v4.new_output("display_data", data={nbfiles.WIDGET_VIEW: {"model_id": "abc"},
                                                                 "text/plain": "[live view of x while it runs]"}),
                    nbformat.v4.new_output("stream", name="stdout", text="OK: x finished\n")]
    notebook.cells.append(cell)
    nbfiles.strip_run_state(notebook)
    assert "widgets" not in notebook.metadata and cell.metadata == {} and cell.execution_count == 3
    assert cell.outputs[0].data == {"text/plain": "[live view of x while it runs]"}
    assert cell.outputs[1].text == "OK: x finished\n"


# --- Predicts ----------------------------------------------------------------------------------------------


def predict_calls(path):
    """(call node, cell) for every predict(...) call in a notebook."""
    for cell in code_cells(read(path)):
        for node in ast.walk(ast.parse(python_of(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "predict":
                yield node, cell


def new_form(call):
    """(qid, question, options) of predict("NN.slug", "question", ["option", ...]), or None."""
    if len(call.args) != 3 or call.keywords:
        return None
    try:
        qid, question, options = (ast.literal_eval(arg) for arg in call.args)
    except ValueError:
        return None
    if isinstance(qid, str) and isinstance(question, str) and isinstance(options, list):
        return qid, question, options
    return None


CALLS = {path.name[:2]: list(predict_calls(path)) for path in NOTEBOOKS}
PREDICTS = {number: [(*new_form(call), cell) for call, cell in calls if new_form(call)]
            for number, calls in CALLS.items()}


def test_predicts_are_in_the_new_form():
    """predict("NN.slug", question, [options]) with literals: the answer lives in notebooks/answers/NN.json."""
    old = [f"{number}: {cell.source.splitlines()[0]}" for number, calls in CALLS.items()
           for call, cell in calls if not new_form(call)]
    assert not old, "convert these (answers to notebooks/answers/NN.json):\n" + "\n".join(old)
    assert sum(map(len, PREDICTS.values())) >= 20


def answers(number):
    path = ANSWERS_FOLDER / f"{number}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_every_predict_has_its_answer_and_every_answer_its_predict():
    files = {p.stem for p in ANSWERS_FOLDER.glob("*.json")}
    assert files <= set(PREDICTS), f"answers files without a notebook: {files - set(PREDICTS)}"
    for number, calls in PREDICTS.items():
        qids = [qid for qid, *_ in calls]
        assert len(qids) == len(set(qids)), f"{number}: a qid is used twice"
        assert all(qid.startswith(f"{number}.") for qid in qids), f"{number}: qids are NN.slug, NN = {number}"
        assert sorted(answers(number)) == sorted(qids), f"notebooks/answers/{number}.json vs notebook {number}"
        for qid, question, options, _ in calls:
            entry = answers(number)[qid]
            assert 0 <= entry["answer"] < len(options) and len(options) >= 2, qid
            assert len(entry["why"]) > 20, f"{qid}: the why explains the answer"
            # the reveal shows the why as plain text (quiz.Prediction escapes it): markdown would show literally
            markup = re.search(r"`|\*\*|(?<![\w*])\*[^*\s][^*]*\*(?![\w*])", entry["why"])
            assert markup is None, f"{qid}: markdown {markup and markup.group()!r} would show as typed; plain words"


def test_predict_cells_are_readable_and_hold_no_answer():
    for number, calls in PREDICTS.items():
        for qid, question, options, cell in calls:
            long_lines = [line for line in cell.source.splitlines() if len(line) > 100]
            assert not long_lines, f"{qid}: lines over 100 characters"
            why = answers(number)[qid]["why"]
            assert why not in cell.source and "answer=" not in cell.source, f"{qid}: the answer is in the cell"


def test_predict_outputs_show_the_whole_question():
    """What nbval compares and the web shows: the full question and every option, with no live widget."""
    for number, calls in PREDICTS.items():
        for qid, question, options, cell in calls:
            shown = [output.data["text/plain"] for output in cell.outputs if "text/plain" in output.get("data", {})]
            assert plain_text(question, options) in shown, f"{qid}: re-execute notebook {number}"


def position_share(entries):
    counts = collections.Counter(entry["answer"] for entry in entries)
    return max(counts.values()) / len(entries)


def strictly_longest(options, answer):
    return all(len(options[answer]) > len(option) for k, option in enumerate(options) if k != answer)


def test_answers_are_not_guessable_by_position_or_length():
    course = []
    for number, calls in PREDICTS.items():
        entries = [answers(number)[qid] for qid, *_ in calls]
        course += [(entry, options) for entry, (_, _, options, _) in zip(entries, calls)]
        if len(entries) >= 4:
            assert position_share(entries) <= 0.4, f"notebook {number}: one answer position holds over 40%"
    assert position_share([entry for entry, _ in course]) <= 0.4, "over the course, one position holds over 40%"
    longest = sum(strictly_longest(options, entry["answer"]) for entry, options in course)
    assert longest <= 0.25 * len(course), f"the right answer is the longest option in {longest} of {len(course)}"


def test_guessability_measures():
    assert position_share([{"answer": 1}, {"answer": 1}, {"answer": 0}]) == pytest.approx(2 / 3)
    assert strictly_longest(["a", "bbb", "cc"], 1) and not strictly_longest(["aa", "bb"], 0)


# --- outputs any laptop reproduces -------------------------------------------------------------------------


def sanitize(text):
    for regex, replace in SANITIZE:
        text = re.sub(regex, replace, text)
    return text


def compared_texts(path):
    """(cell's first line, text) for every output nbval compares (cells without NBVAL_IGNORE_OUTPUT/SKIP)."""
    for cell in code_cells(read(path)):
        markers = dict(find_comment_markers(cell.source))
        if markers.get("check") is False or markers.get("skip"):
            continue
        first_line = cell.source.splitlines()[0] if cell.source else ""
        for output in coalesce_streams(copy.deepcopy(cell.outputs)):
            if output.output_type == "stream":
                yield first_line, output.text
            elif output.output_type == "error":
                yield first_line, f"{output.ename}: {output.evalue}"
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/"):
                    yield first_line, value


INSTALLED_TORCH = importlib.metadata.version("torch")
RELEASE = INSTALLED_TORCH.split("+")[0]
# How each wheel of this release names itself: macOS (no suffix), Linux/Windows CPU, CUDA, ROCm, Intel GPU.
WHEEL_VERSIONS = [RELEASE] + [f"{RELEASE}+{build}" for build in ("cpu", "cu126", "cu128", "cu130", "rocm6.4", "xpu")]


def test_sanitize_rules_hide_the_torch_build():
    assert len({sanitize(f"torch {version}\n") for version in WHEEL_VERSIONS}) == 1
    assert sanitize("torch 2.13.0+cpu") != sanitize("torch 2.12.0+cpu"), "the release itself is still compared"


# This release's version as any wheel prints it, whichever wheel executed the committed notebook.
PRINTED_TORCH = re.compile(re.escape(RELEASE) + r"(\+[A-Za-z0-9.]+)?(?![\w.])")


def with_every_wheel(text):
    """``text`` as each wheel of this release would have printed it: every torch version found in it (the
    committed build, not necessarily the installed one) replaced by each wheel's."""
    return [(version, PRINTED_TORCH.sub(version, text)) for version in WHEEL_VERSIONS]


def test_every_wheel_variant_differs_where_a_version_is_printed():
    """The comparison below is not a text with itself: a committed CPU-wheel text has macOS and CUDA variants
    that differ from it, and the sanitizer makes them equal; with a build-blind sanitizer they would not be."""
    committed = f"doctor: torch {RELEASE}+cpu, gloo available"
    variants = dict(with_every_wheel(committed))
    assert variants[RELEASE] == f"doctor: torch {RELEASE}, gloo available"
    assert variants[f"{RELEASE}+cu128"] == f"doctor: torch {RELEASE}+cu128, gloo available"
    assert len(set(variants.values())) == len(WHEEL_VERSIONS)
    assert len({sanitize(text) for text in variants.values()}) == 1


def test_sanitize_rules_hide_torchs_exit_race_and_nothing_else():
    """A rank torch aborted at exit after a complete run (diagnosis.aborted_after_finishing) writes a terminate
    line and Python's fatal-error dump into a cell that shows every rank: the comparison ignores them."""
    clean = "[rank 0] loss 0.5\n[rank 2] loss 0.5\nOK: labs/02_x.py finished on 3 ranks in 4.1 s.\n"
    raced = ("[rank 0] loss 0.5\n[rank 2] loss 0.5\n[rank 2] terminate called without an active exception\n"
             "[rank 2] Fatal Python error: Aborted\n[rank 2] \n[rank 2] Thread 0x00007f32cde7bb80 (most recent call "
             "first):\n[rank 2]   <no Python frame>\n[rank 2] \n[rank 2] Extension modules: torch._C (total: 22)\n"
             "OK: labs/02_x.py finished on 3 ranks in 4.3 s.\n(after the script ended, torch aborted rank(s) [2] while "
             "exiting: its exit race, docs/troubleshooting.md; the run's results are complete)\n")
    assert sanitize(raced) == sanitize(clean)
    assert sanitize(clean.replace("loss 0.5", "loss 0.6", 1)) != sanitize(clean)  # a rank's own lines still count


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_compared_outputs_are_the_same_with_every_wheel(path):
    for first_line, text in compared_texts(path):
        for version, other in with_every_wheel(text):
            assert sanitize(other) == sanitize(text), f"{path.name}, cell {first_line!r}: with torch {version}"


# A printed fact about this machine's accelerators or this build's backends: different on a CUDA laptop.
DEVICE_FACT = re.compile(r"""\b(nccl|cuda|mps|xpu|gpus?)['"]?(\s*=\s*|:\s+)(True|False|None|\d)"""
                         r"""|\b(device_count|is_available|is_built|version\.cuda)\(?\)?\s*[:=]?\s*(True|False|None|\d)"""
                         r"""|\bCUDA devices:?\s*\d|\b\d+ (CUDA devices|GPUs)\b""", re.IGNORECASE)
SKIPPED_HERE = "not run on this machine"  # a skipped GPU path says so, the same on every CPU machine


def test_device_fact_pattern():
    assert DEVICE_FACT.search("{'gloo': True, 'nccl': False, 'mpi': False}")
    assert DEVICE_FACT.search("torch 2.13.0, CUDA devices: 0") and DEVICE_FACT.search("2 GPUs found")
    assert not DEVICE_FACT.search("device_ids [0, 1], output_device 0, master cuda:0")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_compared_outputs_state_no_device_facts(path):
    facts = [f"cell {first_line!r}: {line.strip()}" for first_line, text in compared_texts(path)
             for line in text.splitlines() if DEVICE_FACT.search(line) and SKIPPED_HERE not in line]
    assert not facts, f"{path.name}: assert these in code and print a machine-independent line:\n" + "\n".join(facts)


def test_a_kernel_from_another_copy_of_the_course_is_named(tmp_path, monkeypatch, capsys):
    """A notebook opened in one copy while the kernel's ddpcourse is another copy would run that copy's labs."""
    from ddpcourse import setup_notebook
    from ddpcourse.authoring.notebooks import NOTEBOOKS

    monkeypatch.chdir(COURSE_ROOT / "clean")
    setup_notebook()
    assert capsys.readouterr().out == "" and os.getcwd() == str(NOTEBOOKS)
    monkeypatch.chdir(tmp_path)
    setup_notebook()
    warning = capsys.readouterr().out
    assert warning.startswith("WARNING: this kernel's ddpcourse is the course in") and str(tmp_path) in warning


def test_every_check_cell_judges_from_a_fresh_recording(monkeypatch):
    """The check cells replay recorded launches (tests/recorded_runs.py, installed in the suite's kernels by
    conftest.py), one per setting of tests/kernel_settings.py (the ranks ran under it). A cell without a fresh
    recording would still run, live: this test makes that visible."""
    from kernel_settings import SETTINGS
    from ddpcourse.paths import resolve_lab
    from recorded_runs import NOTEBOOK_CHECKS, notebook_recording, settings_tag

    monkeypatch.chdir(COURSE_ROOT / "notebooks")  # where the kernels run: "../solutions/05_..." resolves
    monkeypatch.setenv("DDPCOURSE_LAB_SOURCE", "solutions")  # as the suite's kernels have it (kernel_startup.py)
    calls = {(match.group(1), int(match.group(2)) if match.group(2) else None)
             for notebook in NOTEBOOKS for cell in code_cells(read(notebook))
             for match in re.finditer(r'check_lab\("([^"]+)"(?:, nproc=(\d+))?\)', cell.source)}
    assert len(calls) >= len(NOTEBOOKS)  # every notebook checks its lab
    used = set()
    for lab, nproc in sorted(calls, key=str):
        for setting in SETTINGS:
            found = notebook_recording(resolve_lab(lab), nproc, settings_tag(setting))
            results, problem = found.load()
            assert not problem, problem
            if results is None:
                pytest.skip("the recordings are another kind of machine's: its kernels check live")
            used.add(found.path)
    assert set(NOTEBOOK_CHECKS.glob("*.json.gz")) == used  # and none left over from a cell that is gone


def test_every_notebook_launch_is_recorded_fresh_under_each_setting():
    """The notebooks' own launches replay too (tests/recorded_runs.py). Each recording's key, made again from the
    call it stores, still matches (the programs and the course code are as recorded); each launch was recorded
    under exactly the four settings of tests/kernel_settings.py, or some commit's rotation would fail; and the
    notebooks' recordings were all made on one kind of machine, as were the lab tests' (one recorded elsewhere
    would run live, unnoticed)."""
    from kernel_settings import SETTINGS
    from recorded_runs import (NOTEBOOK_RUNS, RECORDINGS, RERECORD, environment_key, read_recording,
                               run_recording, settings_tag)

    kernels = {read_recording(path)["environment"] for path in NOTEBOOK_RUNS.rglob("*.json.gz")}
    labs = {read_recording(path)["environment"] for path in RECORDINGS.glob("test_*/*.json.gz")}
    assert len(kernels) == 1 and len(labs) == 1, f"recordings of several machines: record afresh with `{RERECORD}`"
    folders = sorted(path for path in NOTEBOOK_RUNS.iterdir() if path.is_dir())
    assert {folder.name for folder in folders} <= {notebook.stem for notebook in NOTEBOOKS}  # none of a gone one
    assert len(folders) >= 6  # most notebooks launch a demo or a lab of their own
    this_machine = kernels == {environment_key(tagged=True)}
    every_setting = {settings_tag(setting) for setting in SETTINGS}
    for folder in folders:
        tags = collections.defaultdict(set)
        for path in folder.glob("*.json.gz"):
            stored = read_recording(path)
            name, occurrence, tag = path.name.removesuffix(".json.gz").split("_")
            again = run_recording(folder.name, stored["call"], int(occurrence), tag)
            assert again.path == path and again.key == stored["key"], (
                f"{path.relative_to(COURSE_ROOT)} is stale: record afresh with `{RERECORD}`")
            tags[name, int(occurrence)].add(tag)
        missing = {launch: every_setting - found for launch, found in tags.items() if found != every_setting}
        # another machine (an ARM Mac: other settings) launches live, and needs none of them
        assert not (this_machine and missing), (
            f"{folder.name}: launches not recorded under every setting: {missing}; `{RERECORD}`")
