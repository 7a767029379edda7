"""docs/glossary.md and the "Before you start" cell of every notebook, checked as files (no kernel, no launch).

    python docs/lint/glossary.py --check   # one line per problem, exit 1; else a one-line "ok"

Why: the glossary is where a learner looks a term up in the middle of a notebook, and "Before you start" is
the first thing a notebook shows; a broken link, an entry that points at no notebook, a term the course uses
but never defines, or a prerequisite that comes later in the course fails the learner where no cell runs to
notice. Standard library only.

1. Every notebook (notebooks/ and its clean/ copy) has, right after its title cell, a markdown cell that starts
   with **Before you start**: a **Prerequisites** list of at least one line (from notebook 01 on, naming
   earlier modules by a link to their notebooks), **After this module you can:** with 3 to 5 numbered
   objectives of 8 words or more, and a link to the glossary that resolves from the notebook's own folder.
   The clean copy's cell is the executed notebook's.
2. Every glossary entry is an anchor, a heading, a definition (12 words or more), and one "Introduced in"
   line whose first link names an existing notebook (its clean/ copy) and a section (§); entries are in
   alphabetical order, anchors unique, and every link inside the glossary resolves. Every notebook
   introduces at least one term, and no entry names a notebook that does not exist.
3. Every term of the course's required list (REQUIRED) has its entry, named in the entry's heading, and
   every glossary anchor that a notebook links to exists.

Each rule is a function that returns its problems as one-line messages naming the file and the place;
``problems(root)`` runs them all.
"""
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line beside it
import lint_main  # noqa: E402

COURSE_ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = COURSE_ROOT / "docs" / "glossary.md"

# The terms the course must define (as its brief names them) -> the glossary anchor that defines them. The
# term itself must appear in that entry's heading ("DDP" in "DistributedDataParallel (DDP)").
REQUIRED = {
    "rank": "rank", "local rank": "local-rank", "world size": "world-size", "process group": "process-group",
    "backend": "backend", "gloo": "gloo", "nccl": "nccl", "collective": "collective",
    "broadcast": "broadcast", "all-reduce": "all-reduce", "reduce": "reduce", "all-gather": "all-gather",
    "gather": "gather", "reduce-scatter": "reduce-scatter", "barrier": "barrier",
    "DataParallel": "dataparallel", "DistributedDataParallel": "ddp", "DDP": "ddp", "replica": "replica",
    "bucket": "bucket", "gradient hook": "gradient-hook", "no_sync": "no-sync",
    "gradient accumulation": "gradient-accumulation", "find_unused_parameters": "find-unused-parameters",
    "static_graph": "static-graph", "buffers": "buffers", "broadcast_buffers": "forward-sync-buffers",
    "forward_sync_buffers": "forward-sync-buffers", "torchrun": "torchrun", "rendezvous": "rendezvous",
    "elastic restart": "elastic-restart", "--max-restarts": "elastic-restart",
    "DistributedSampler": "distributedsampler", "Join": "join", "local SGD": "local-sgd",
    "model averaging": "local-sgd", "checkpoint": "checkpoint", "atomic write": "checkpoint",
    "overlap": "overlap", "latency": "latency-bandwidth", "bandwidth": "latency-bandwidth",
    "α-β cost": "latency-bandwidth",
}

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
ENTRY = re.compile(r'^<a id="([^"]+)"></a>\s*\n+### ([^\n]+)\n(.*?)(?=^<a id=|\Z)', re.M | re.S)
INTRODUCED = "**Introduced in:**"
NOTEBOOK_LINK = re.compile(r"^\.\./clean/(\d\d)_\w+\.ipynb$")  # the learner's copy: no outputs to spoil a Predict


def notebook_paths(folder):
    return sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))


def text_of(value):
    return "".join(value) if isinstance(value, list) else (value or "")


def load(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def where(path):
    """A notebook as its messages name it: its folder and file (notebooks/ and clean/ hold the same names)."""
    return f"{Path(path).parent.name}/{Path(path).name}"


def line_at(text, offset):
    return text.count("\n", 0, offset) + 1


# --- the glossary ------------------------------------------------------------------------------------------


def glossary_entries(text):
    """(anchor, heading, body) of every entry of a glossary text."""
    return ENTRY.findall(text)


def sort_key(heading):
    return re.sub(r"[^a-z0-9]", "", heading.lower())


def glossary_problems(text, folder=GLOSSARY.parent, name="docs/glossary.md"):
    """What is wrong with a glossary text whose relative links start from `folder`; `name` is the file the
    messages name, with the line of each entry or link."""
    problems = []
    matches = list(ENTRY.finditer(text))
    entries = [match.groups() for match in matches]
    anchors = [anchor for anchor, _, _ in entries]
    if len(entries) != text.count("<a id="):
        problems.append(f"{name}: {text.count('<a id=')} anchors but {len(entries)} entries of anchor, "
                        "### heading, text")
    if len(anchors) != len(set(anchors)):
        problems.append(f"{name}: anchors used twice: {sorted({a for a in anchors if anchors.count(a) > 1})}")
    headings = [heading for _, heading, _ in entries]
    if headings != sorted(headings, key=sort_key):
        misplaced = next(i for i in range(1, len(headings)) if sort_key(headings[i]) < sort_key(headings[i - 1]))
        problems.append(f"{name} line {line_at(text, matches[misplaced].start(2))}: entries not in alphabetical "
                        f"order, first misplaced: {headings[misplaced]!r}")
    for match in matches:
        anchor, heading, body = match.groups()
        place = f"{name} line {line_at(text, match.start(2))}: {heading}"
        introduced = [line for line in body.splitlines() if line.startswith(INTRODUCED)]
        definition = "\n".join(line for line in body.splitlines() if not line.startswith(INTRODUCED))
        if len(re.findall(r"\w+", definition)) < 12:
            problems.append(f"{place}: no definition (fewer than 12 words)")
        if len(introduced) != 1:
            problems.append(f"{place}: needs exactly one line starting {INTRODUCED}")
            continue
        links = LINK.findall(introduced[0])
        first = NOTEBOOK_LINK.match(links[0][1]) if links else None
        if not first:
            problems.append(f"{place}: its {INTRODUCED} line does not start with a link to a notebook")
        elif not (folder / links[0][1]).is_file():
            problems.append(f"{place}: introduced in {links[0][1]}, which does not exist")
        elif "§" not in links[0][0] and not re.search(r"introduction|lab \d\d", links[0][0]):
            problems.append(f"{place}: {INTRODUCED} names no section (§) of notebook {first.group(1)}")
    for match in LINK.finditer(text):
        target = match.group(2)
        path, _, fragment = target.partition("#")
        if re.match(r"^[a-z]+:", target):
            continue
        if path and not (folder / path).is_file():
            problems.append(f"{name} line {line_at(text, match.start())}: link to {target}: no such file")
        if not path and fragment not in anchors:
            problems.append(f"{name} line {line_at(text, match.start())}: link to #{fragment}: no such anchor")
    return problems


def missing_required_terms(text, required=REQUIRED, name="docs/glossary.md"):
    """A required term without its entry, or whose entry's heading does not name it."""
    entries = {anchor: heading for anchor, heading, _ in glossary_entries(text)}
    problems = []
    for term, anchor in required.items():
        if anchor not in entries:
            problems.append(f"{name}: {term}: no entry #{anchor}")
        elif term.lower() not in entries[anchor].lower():
            problems.append(f"{name}: {term}: entry #{anchor} ({entries[anchor]!r}) does not name it")
    return problems


def introduced_in(text):
    """The notebook numbers that the entries' "Introduced in" lines name first (entries without one aside)."""
    numbers = set()
    for _, _, body in glossary_entries(text):
        for line in body.splitlines():
            links = LINK.findall(line) if line.startswith(INTRODUCED) else []
            first = NOTEBOOK_LINK.match(links[0][1]) if links else None
            numbers |= {first.group(1)} if first else set()
    return numbers


def introduction_problems(text, numbers, name="docs/glossary.md"):
    """Every notebook of `numbers` ("00", "01", ...) introduces a term; no entry names another notebook."""
    introduced = introduced_in(text)
    problems = []
    if introduced - set(numbers):
        problems.append(f"{name}: terms introduced in notebooks that do not exist: {sorted(introduced - set(numbers))}")
    if set(numbers) - introduced:
        problems.append(f"{name}: no term introduced in notebooks {sorted(set(numbers) - introduced)}")
    return problems


# --- the notebooks' "Before you start" cell ------------------------------------------------------------------


def lines_between(source, start, end):
    """The lines of a markdown source after the line `start` and before the line that starts with `end`."""
    lines = source.splitlines()
    if start not in lines:
        return None
    following = lines[lines.index(start) + 1:]
    stop = next((i for i, line in enumerate(following) if line.startswith(end)), len(following))
    return following[:stop]


def items(lines, marker):
    """The list items of some markdown lines: each starts with `marker` (a regex); indented lines continue it."""
    found = []
    for line in lines:
        if re.match(marker, line):
            found.append(line)
        elif line.startswith(" ") and found:
            found[-1] += " " + line.strip()
    return found


def before_you_start_problems(notebook, path, glossary=GLOSSARY):
    """What is wrong with the Before-you-start cell of a notebook (its JSON), read as the file at `path`; its
    glossary links must reach `glossary`."""
    path = Path(path)
    cells = notebook["cells"]
    number = path.name[:2]
    if not cells or cells[0]["cell_type"] != "markdown" or not text_of(cells[0]["source"]).startswith(f"# {number} "):
        return [f"{where(path)} cell 0: the first cell is not the title (# {number} ...)"]
    found = [i for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             and text_of(cell["source"]).startswith("**Before you start**")]
    if found != [1]:
        return [f"{where(path)}: the Before-you-start cell must be cell 1, right after the title, once (found {found})"]
    source = text_of(cells[1]["source"])
    place = f"{where(path)} cell 1"
    problems = []
    prerequisites = items(lines_between(source, "**Prerequisites**", "**After this module") or [], r"- \S")
    if not prerequisites:
        problems.append(f"{place}: no prerequisite line (- ...) under **Prerequisites**")
    modules = [line for line in prerequisites if line.startswith("- Modules:")]
    earlier = {int(n) for line in modules for _, target in LINK.findall(line)
               for n in re.findall(r"^(\d\d)_\w+\.ipynb$", target)}
    if int(number) > 0 and (not earlier or max(earlier) >= int(number)):
        problems.append(f"{place}: the Modules line must link the earlier modules it needs (found {sorted(earlier)})")
    for _, target in LINK.findall("\n".join(modules)):
        if not (path.parent / target).is_file():
            problems.append(f"{place}: prerequisite link {target} does not resolve")
    objectives = items(lines_between(source, "**After this module you can:**", "**Glossary") or [], r"\d+\. \S")
    if not 3 <= len(objectives) <= 5:
        problems.append(f"{place}: {len(objectives)} objectives under **After this module you can:** (3 to 5)")
    short = [line for line in objectives if len(line.split()) < 8]
    if short:
        problems.append(f"{place}: objectives too short to be checkable: {short}")
    glossary_links = [target for _, target in LINK.findall(source) if target.split("#")[0].endswith("glossary.md")]
    if not glossary_links:
        problems.append(f"{place}: no link to the glossary")
    for target in glossary_links:
        resolved = (path.parent / target.split("#")[0]).resolve()
        if resolved != Path(glossary).resolve() or not resolved.is_file():
            problems.append(f"{place}: glossary link {target} resolves to {resolved}, not {glossary}")
    return problems


def glossary_anchor_problems(notebook, path, anchors):
    """Links from any markdown cell of a notebook to a glossary anchor that does not exist."""
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for _, target in LINK.findall(text_of(cell["source"])):
            file, _, fragment = target.partition("#")
            if file.endswith("glossary.md") and fragment and fragment not in anchors:
                problems.append(f"{where(path)} cell {index}: links {target}, but the glossary has no anchor "
                                f"#{fragment}")
    return problems


def clean_copy_problems(notebooks, clean):
    """The clean copies are the notebooks' (same names) and carry the same Before-you-start cell."""
    if [p.name for p in clean] != [p.name for p in notebooks]:
        return [f"clean/: holds {[p.name for p in clean]}, notebooks/ {[p.name for p in notebooks]}"]
    return [f"{where(copy)} cell 1: differs from {where(executed)}'s Before-you-start cell"
            for executed, copy in zip(notebooks, clean)
            if load(executed)["cells"][1:2] and load(copy)["cells"][1:2]
            and load(executed)["cells"][1]["source"] != load(copy)["cells"][1]["source"]]


# --- the whole course ------------------------------------------------------------------------------------------


def problems(root=COURSE_ROOT):
    """Every problem of the three rules on the course at `root`, one line each."""
    root = Path(root)
    glossary = root / "docs" / "glossary.md"
    text = glossary.read_text(encoding="utf-8")
    notebooks, clean = notebook_paths(root / "notebooks"), notebook_paths(root / "clean")
    anchors = {anchor for anchor, _, _ in glossary_entries(text)}
    found = glossary_problems(text, glossary.parent) + missing_required_terms(text)
    found += introduction_problems(text, [path.name[:2] for path in notebooks])
    for path in notebooks + clean:
        notebook = load(path)
        found += before_you_start_problems(notebook, path, glossary) + glossary_anchor_problems(notebook, path, anchors)
    return found + clean_copy_problems(notebooks, clean)


def _summary(root):
    """The one line said when nothing is wrong."""
    entries = glossary_entries((root / "docs" / "glossary.md").read_text(encoding="utf-8"))
    count = len(notebook_paths(root / "notebooks")) + len(notebook_paths(root / "clean"))
    return (f"glossary ok: {len(entries)} entries ({len(REQUIRED)} required terms), {count} notebooks' "
            "Before-you-start cells and glossary links")


def main(argv=None):
    return lint_main.check(__doc__, problems, _summary, COURSE_ROOT, argv)


if __name__ == "__main__":
    sys.exit(main())
