"""Print docs/cheatsheet.md as docs/cheatsheet.pdf: A4, a fixed monospace layout, at most 2 pages.

    python docs/make_printable.py            # write the PDF
    python docs/make_printable.py --check    # exit 1 if the PDF is missing, stale or over 2 pages

The layout is a pure function of the markdown (``layout``), so a test can count the pages without
drawing them; the PDF records the sha256 of the markdown it was made from, so a test can tell that it
is stale without re-drawing it.
"""
import argparse
import hashlib
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
SOURCE = DOCS / "cheatsheet.md"
TARGET = DOCS / "cheatsheet.pdf"
MAX_PAGES = 2

PAGE_WIDTH, PAGE_HEIGHT = 8.27, 11.69       # A4, inches
MARGIN = 0.45                               # inches, every side
FONT_SIZE = 7.4                             # points; 100 monospace characters fit the width
LINE_HEIGHT = FONT_SIZE * 1.2 / 72          # inches
LINES_PER_PAGE = int((PAGE_HEIGHT - 2 * MARGIN) / LINE_HEIGHT)
KEEP_WITH_NEXT = 6                          # a heading never starts a section in a page's last lines


def source_digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def plain(text):
    """Markdown inline markup removed: what the printed line shows."""
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)  # a link prints as its text
    return text.replace("`", "")


def printed_lines(markdown):
    """(kind, text) for each printed line; kind is "title", "heading", "code" or "text"."""
    lines, in_code = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            lines.append(("code", line))
        elif re.match(r"^\|[-| ]+\|$", line):
            continue                                         # a table's separator row
        elif line.startswith("|"):
            cells = [plain(cell.strip()) for cell in line.strip("|").split("|")]
            lines.append(("text", f"{cells[0]:<24} {' '.join(cells[1:])}"))
        elif line.startswith("# "):
            lines.append(("title", plain(line[2:])))
        elif line.startswith("## "):
            lines.append(("heading", plain(line[3:])))
        else:
            lines.append(("text", plain(line)))
    return lines


def layout(markdown):
    """The printed lines split into pages: a list of pages, each a list of (kind, text)."""
    pages, page = [], []
    for kind, text in printed_lines(markdown):
        room = LINES_PER_PAGE - len(page)
        if room == 0 or (kind == "heading" and room < KEEP_WITH_NEXT):
            pages.append(page)
            page = []
        if page or text.strip():                             # no blank line at the top of a page
            page.append((kind, text))
    return pages + [page] if page else pages


def write_pdf(markdown, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    matplotlib.rcParams["pdf.fonttype"] = 42
    styles = {"title": dict(size=FONT_SIZE + 2, weight="bold"), "heading": dict(size=FONT_SIZE, weight="bold"),
              "code": dict(size=FONT_SIZE, color="#1f3a93"), "text": dict(size=FONT_SIZE)}
    metadata = {"Title": "ddpcourse cheat sheet", "Subject": f"cheatsheet.md sha256 {source_digest(markdown)}",
                "Creator": "docs/make_printable.py", "CreationDate": None}
    with PdfPages(target, metadata=metadata) as pdf:
        for number, page in enumerate(layout(markdown), 1):
            figure = plt.figure(figsize=(PAGE_WIDTH, PAGE_HEIGHT))
            for row, (kind, text) in enumerate(page):
                y = 1 - (MARGIN + (row + 0.8) * LINE_HEIGHT) / PAGE_HEIGHT
                figure.text(MARGIN / PAGE_WIDTH, y, text, family="DejaVu Sans Mono", **styles[kind])
            figure.text(1 - MARGIN / PAGE_WIDTH, MARGIN / 2 / PAGE_HEIGHT, f"page {number}",
                        family="DejaVu Sans Mono", size=FONT_SIZE - 1, ha="right", color="gray")
            pdf.savefig(figure)
            plt.close(figure)


def pdf_facts(path):
    """(pages, source digest) read back from a PDF this script wrote."""
    data = Path(path).read_bytes()
    pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", data))
    digest = re.search(rb"cheatsheet\.md sha256 ([0-9a-f]{64})", data)
    return pages, digest.group(1).decode() if digest else None


def problems(source=SOURCE, target=TARGET):
    """What is wrong with the printable form, as sentences; empty when it is up to date."""
    markdown = Path(source).read_text()
    found = []
    if len(layout(markdown)) > MAX_PAGES:
        found.append(f"{source.name} lays out on {len(layout(markdown))} pages (at most {MAX_PAGES})")
    if not Path(target).is_file():
        return found + [f"{target.name} is missing: run python docs/make_printable.py"]
    pages, digest = pdf_facts(target)
    if digest != source_digest(markdown):
        found.append(f"{target.name} is older than {source.name}: run python docs/make_printable.py")
    if pages > MAX_PAGES:
        found.append(f"{target.name} has {pages} pages (at most {MAX_PAGES})")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the PDF is up to date")
    options = parser.parse_args()
    if not options.check:
        write_pdf(SOURCE.read_text(), TARGET)
    found = problems()
    for problem in found:
        print(problem)
    if not found:
        print(f"{TARGET.relative_to(DOCS.parent)}: {pdf_facts(TARGET)[0]} page(s), up to date")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
