"""docs/cheatsheet.md and its printed form, docs/cheatsheet.pdf, checked as files.

    python docs/lint/cheatsheet.py --check   # one line per problem, exit 1; else a one-line "ok"

Why: the sheet is what a learner keeps on the desk and copies code from. It must print, on whatever paper
they have, at a size they can read, and any one of its python blocks must work when copied alone.

1. The markdown: lines of at most 100 characters (the printed width), no .svg figures and no links (a
   printed page cannot follow them).
2. The print: up to date, at most two pages (docs/make_printable.py's own check, and its page count equals
   its layout's), 9 pt text on a page that fits inside both A4 and US Letter, checked twice: from
   make_printable.py's own layout numbers (its page is the largest inside both papers; the widest line and
   the fullest page fit inside its margins; every page's header line and its docstring name both papers),
   and from the PDF's bytes (each page's MediaBox, each line's font size and position, a quarter inch free
   at every edge).
3. The python blocks (at least 4): each compiles and imports or defines every name it uses (read with
   ``ast``; PLACEHOLDERS lists the names a block may take from the sheet's prose: none).

That the blocks also run, and that each fact the sheet states about torch holds on the torch installed,
is tests/test_cheatsheet.py's: those need torch and a process group. Standard library only here.

Each rule is a function that returns its problems as one-line messages naming the file and the place;
``problems(root)`` runs them all.
"""
import ast
import builtins
import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line beside it
import lint_main  # noqa: E402

COURSE_ROOT = Path(__file__).resolve().parents[2]
POINTS_PER_MM = 72 / 25.4
A4 = (210 * POINTS_PER_MM, 297 * POINTS_PER_MM)    # 595.28 x 841.89 points
LETTER = (8.5 * 72, 11 * 72)                       # 612 x 792 points
MIN_FONT_SIZE = 9                                  # points: the smallest size a learner reads at a desk
COURIER_WIDTH = 0.6                                # em a character, every character of Courier
MAX_LINE = 100                                     # characters of a markdown line: the printed width
MIN_BLOCKS = 4                                     # fewer python blocks: the reader no longer finds them
EDGE = 18                                          # points (1/4 in) left free at every edge of the PDF's page

# Names a python block may use without importing or defining them: none. Every block brings its own
# imports and stand-ins (a tiny model, a list as the loader), so a learner can copy any one of them
# alone. A name added here must be one the sheet's prose defines, with the place it does so.
PLACEHOLDERS = set()


def printable(root=COURSE_ROOT):
    """docs/make_printable.py of the course at `root`, imported from its path (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("make_printable", Path(root) / "docs" / "make_printable.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cheatsheet(root=COURSE_ROOT):
    return (Path(root) / "docs" / "cheatsheet.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- the markdown
def line_problems(markdown, name="docs/cheatsheet.md"):
    """Lines longer than the printed width; .svg figures and links, which a printed page cannot show."""
    problems = []
    for number, line in enumerate(markdown.splitlines(), 1):
        if len(line) > MAX_LINE:
            problems.append(f"{name} line {number}: {len(line)} characters (at most {MAX_LINE}): {line[:60]!r}...")
        if ".svg" in line:
            problems.append(f"{name} line {number}: an .svg figure does not print: {line[:80]!r}")
        if "](" in line:
            problems.append(f"{name} line {number}: a link does not print (write its text): {line[:80]!r}")
    return problems


# ----------------------------------------------------------------------------- the printed form
def printable_problems(root=COURSE_ROOT):
    """make_printable's own check (up to date, deterministic, at most 2 pages), and the PDF's page count is
    its layout's."""
    make = printable(root)
    problems = [f"docs/cheatsheet.pdf: {problem}" for problem in make.problems()]
    if make.TARGET.is_file():
        pages, _ = make.pdf_facts(make.TARGET)
        laid_out = len(make.layout(make.SOURCE.read_text()))
        if pages != laid_out:
            problems.append(f"docs/cheatsheet.pdf: {pages} pages, its layout {laid_out}: "
                            "run python docs/make_printable.py")
    return problems


def layout_problems(root=COURSE_ROOT):
    """make_printable's own numbers: its page lies inside both papers and is the largest such page, the font
    is 9 pt or more, and the widest printed line and the fullest page fit inside its margins."""
    make, problems = printable(root), []
    where = "docs/make_printable.py"
    if make.FONT_SIZE < MIN_FONT_SIZE or make.LINE_HEIGHT < make.FONT_SIZE:
        problems.append(f"{where}: FONT_SIZE {make.FONT_SIZE} pt, LINE_HEIGHT {make.LINE_HEIGHT} "
                        f"(at least {MIN_FONT_SIZE} pt, and lines no closer than the font size)")
    for paper_name, paper in (("A4", A4), ("US Letter", LETTER)):
        if make.PAGE_WIDTH > paper[0] + 0.01 or make.PAGE_HEIGHT > paper[1] + 0.01:
            problems.append(f"{where}: a {make.PAGE_WIDTH} x {make.PAGE_HEIGHT} pt page does not fit {paper_name}")
    # the largest such page: nothing left unused that a larger font could have had
    largest = (min(A4[0], LETTER[0]), min(A4[1], LETTER[1]))
    if abs(make.PAGE_WIDTH - largest[0]) > 0.01 or abs(make.PAGE_HEIGHT - largest[1]) > 0.01:
        problems.append(f"{where}: the page is {make.PAGE_WIDTH} x {make.PAGE_HEIGHT} pt, not the largest inside "
                        f"both papers ({largest[0]:.2f} x {largest[1]:.2f})")
    pages = make.layout(make.SOURCE.read_text())
    if len(pages) > 2:
        problems.append(f"{where}: the layout has {len(pages)} pages (at most 2)")
    widest = max((text for page in pages for _, text in page), key=len, default="")
    if len(widest) * COURIER_WIDTH * make.FONT_SIZE > make.PAGE_WIDTH - 2 * make.MARGIN_X:
        problems.append(f"{where}: the printed line {widest[:60]!r}... is wider than the page's margins")
    fullest = max((len(page) for page in pages), default=0)
    if fullest * make.LINE_HEIGHT > make.PAGE_HEIGHT - 2 * make.MARGIN_Y:
        problems.append(f"{where}: a page of {fullest} lines is taller than the page's margins")
    for number, page in enumerate(pages, 1):
        if not ("A4" in page[0][1] and "US Letter" in page[0][1]):
            problems.append(f"{where}: page {number}'s header line names not both papers: {page[0][1]!r}")
    if not all(words in (make.__doc__ or "") for words in ("A4", "US Letter", "210 mm x 11 in")):
        problems.append(f"{where}: its docstring no longer says the page is 210 mm x 11 in, for A4 and US Letter")
    return problems


# one line of text: its font size, its position (the text matrix), its string
PDF_LINE = re.compile(rb"/F\d+ ([\d.]+) Tf .*? 1 0 0 1 ([\d.]+) ([\d.]+) Tm \(((?:\\.|[^\\)])*)\) Tj")


def pdf_pages(data):
    """[(media box, [(font size, x, y, text), ...], lines drawn), ...]: each page of a PDF whose streams are
    plain; "lines drawn" counts the stream's Tj operators, which is more than the lines read when a line is
    drawn in a way this reader does not parse."""
    objects = {int(number): body for number, body in re.findall(rb"(?m)^(\d+) 0 obj\n(.*?)\nendobj", data, re.S)}
    pages = []
    for body in objects.values():
        if not re.match(rb"<< /Type /Page\b(?!s)", body):
            continue
        box = [float(value) for value in re.search(rb"/MediaBox \[([^\]]*)\]", body).group(1).split()]
        content = objects[int(re.search(rb"/Contents (\d+) 0 R", body).group(1))]
        stream = re.search(rb"stream\n(.*)endstream", content, re.S).group(1)
        lines = []
        for size, x, y, text in re.findall(PDF_LINE, stream):
            text = re.sub(rb"\\(.)", rb"\1", text).decode("ascii")
            lines.append((float(size), float(x), float(y), text))
        pages.append((box, lines, stream.count(b" Tj")))
    return pages


def pdf_problems(data, name="docs/cheatsheet.pdf"):
    """Read back from the PDF's bytes: plain streams, 1 or 2 pages, each page's MediaBox inside both papers,
    its header line naming both, every line at 9 pt or more and a quarter inch inside the page."""
    if b"/Filter" in data:
        return [f"{name}: compressed streams: what this reads would not be what prints"]
    pages = pdf_pages(data)
    problems = []
    if not 1 <= len(pages) <= 2 or len(pages) != len(re.findall(rb"/Type\s*/Page\b(?!s)", data)):
        problems.append(f"{name}: {len(pages)} pages read (1 or 2, every page object)")
    for number, ((left, bottom, right, top), lines, drawn) in enumerate(pages, 1):
        place = f"{name} page {number}"
        width, height = right - left, top - bottom
        for paper_name, paper in (("A4", A4), ("US Letter", LETTER)):
            if width > paper[0] + 0.01 or height > paper[1] + 0.01:
                problems.append(f"{place}: {width:g} x {height:g} pt is larger than {paper_name}")
        if drawn != len(lines):
            problems.append(f"{place}: {drawn - len(lines)} line(s) drawn in a way this reader does not parse")
        if len(lines) <= 20:
            problems.append(f"{place}: {len(lines)} lines")
            continue
        if not ("A4" in lines[0][3] and "US Letter" in lines[0][3]):
            problems.append(f"{place}: the header line names not both papers: {lines[0][3]!r}")
        for size, x, y, text in lines:
            if size < MIN_FONT_SIZE:
                problems.append(f"{place}: {size:g} pt (at least {MIN_FONT_SIZE}): {text[:60]!r}")
            if x < EDGE or x + len(text) * COURIER_WIDTH * size > width - EDGE:
                problems.append(f"{place}: the line at x {x:g} leaves the page's side: {text[:60]!r}")
            if y < EDGE or y + size > height - EDGE:
                problems.append(f"{place}: the line at y {y:g} leaves the page's top or foot: {text[:60]!r}")
    return problems


# ----------------------------------------------------------------------------- the python blocks
def python_blocks(markdown):
    return re.findall(r"^```python\n(.*?)^```", markdown, re.S | re.M)


def unbound_names(code):
    """The names ``code`` loads that it never imports, assigns, defines or takes as an argument, and that are
    no builtins: what it expects from outside."""
    tree = ast.parse(code)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return loaded - bound - set(dir(builtins))


def python_block_problems(markdown, name="docs/cheatsheet.md"):
    """A python block that does not compile, or that uses a name it neither imports nor defines."""
    blocks = python_blocks(markdown)
    if len(blocks) < MIN_BLOCKS:
        return [f"{name}: {len(blocks)} python blocks found (at least {MIN_BLOCKS}): the sheet's blocks were not found"]
    problems = []
    for number, code in enumerate(blocks, 1):
        try:
            compile(code, f"python block {number}", "exec")
        except SyntaxError as error:
            problems.append(f"{name} python block {number}: does not compile: {error}")
            continue
        missing = unbound_names(code) - PLACEHOLDERS
        if missing:
            problems.append(f"{name} python block {number}: uses {sorted(missing)} without importing or defining them")
    return problems


# ----------------------------------------------------------------------------- the whole sheet
def problems(root=COURSE_ROOT):
    """Every problem of the three rules on the course at `root`, one line each."""
    markdown, pdf = cheatsheet(root), Path(root) / "docs" / "cheatsheet.pdf"
    found = line_problems(markdown) + printable_problems(root) + layout_problems(root)
    found += pdf_problems(pdf.read_bytes()) if pdf.is_file() else []  # a missing PDF: printable_problems says so
    return found + python_block_problems(markdown)


def _summary(root):
    """The one line said when nothing is wrong."""
    pages = pdf_pages((root / "docs" / "cheatsheet.pdf").read_bytes())
    return (f"cheatsheet ok: {len(pages)} page(s) inside A4 and US Letter at {MIN_FONT_SIZE} pt or more, "
            f"{len(python_blocks(cheatsheet(root)))} python blocks that bind every name they use")


def main(argv=None):
    return lint_main.check(__doc__, problems, _summary, COURSE_ROOT, argv)


if __name__ == "__main__":
    sys.exit(main())
