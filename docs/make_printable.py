"""Print docs/cheatsheet.md as docs/cheatsheet.pdf: 9 pt monospace, at most 2 pages, for A4 and US Letter.

    python docs/make_printable.py            # write the PDF
    python docs/make_printable.py --check    # exit 1 if the PDF is missing, stale or over 2 pages

One page size serves both papers: 210 mm x 11 in (595.28 x 792 pt), A4's width and US Letter's height,
the largest page that lies inside both. Printed at 100 % it loses nothing on either sheet (only blank
paper is left over: 18 mm at the foot of A4, 3 mm at each side of Letter), and a printer's "fit to
page" has nothing to shrink, so the text stays 9 pt. The header line of every page says so.

The PDF is written by hand with the standard library: the base-14 Courier fonts (nothing embedded,
every character 0.6 em wide), uncompressed page streams, no date. The bytes are a pure function of the
markdown and the constants below, so ``--check`` renders them again and compares; the PDF also records
the sha256 of the markdown it was made from, to say which of the two changed. The layout is a function
(``layout``) too, so a test can count the pages and measure the lines without drawing them.
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

POINTS_PER_INCH, POINTS_PER_MM = 72, 72 / 25.4
A4 = (round(210 * POINTS_PER_MM, 2), round(297 * POINTS_PER_MM, 2))   # (595.28, 841.89) points
LETTER = (8.5 * POINTS_PER_INCH, 11 * POINTS_PER_INCH)                # (612.0, 792.0) points
PAGE_WIDTH, PAGE_HEIGHT = min(A4[0], LETTER[0]), min(A4[1], LETTER[1])  # inside both: 595.28 x 792
MARGIN_X = 27                               # points (0.375 in, 9.5 mm), left and right
MARGIN_Y = 24                               # points (0.33 in, 8.5 mm), top and bottom
FONT_SIZE = 9                               # points, every line, header included
CHAR_WIDTH = 0.6 * FONT_SIZE                # Courier: 600/1000 em a character
LINE_HEIGHT = 10.3                          # points, baseline to baseline
LINES_PER_PAGE = int((PAGE_HEIGHT - 2 * MARGIN_Y) // LINE_HEIGHT)      # header and its blank line included
MAX_CHARACTERS = int((PAGE_WIDTH - 2 * MARGIN_X) // CHAR_WIDTH)        # 100
KEEP_WITH_NEXT = 6                          # a heading never starts a section in a page's last lines
PAPER = "a 210 mm x 11 in page, printed at 100 % on A4 or US Letter"
FONTS = {"title": "F2", "heading": "F2", "code": "F1", "text": "F1", "header": "F1"}   # F2: Courier-Bold
COLOURS = {"code": "0.12 0.23 0.58 rg", "header": "0.4 g"}                         # the rest: black


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


def header(number, count):
    return f"ddpcourse cheat sheet {number}/{count}: {PAPER}, {FONT_SIZE} pt"


def layout(markdown):
    """The printed lines split into pages: a list of pages, each a list of (kind, text), the header first."""
    pages, page = [], []
    room_for_text = LINES_PER_PAGE - 2                       # the header line and a blank line
    for kind, text in printed_lines(markdown):
        room = room_for_text - len(page)
        if room == 0 and kind == "text" and text.startswith("  "):   # a list item moves over whole
            start = len(page) - 1
            while start > 0 and page[start][0] == "text" and page[start][1].startswith("  "):
                start -= 1
            if start > 0 and page[start][1].startswith("- "):
                pages.append(page[:start])
                page = page[start:]
                room = room_for_text - len(page)
        if room == 0 or (kind == "heading" and room < KEEP_WITH_NEXT):
            pages.append(page)
            page = []
        if page or text.strip():                             # no blank line at the top of a page
            page.append((kind, text))
    pages = pages + [page] if page else pages
    return [[("header", header(number, len(pages))), ("text", "")] + page for number, page in enumerate(pages, 1)]


def pdf_string(text):
    if not text.isascii():
        raise ValueError(f"only ASCII prints in the base-14 fonts: {text!r}")
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def page_stream(page):
    """The content stream of one page: one text object a line, the first baseline a line below the margin."""
    ops = []
    for row, (kind, text) in enumerate(page):
        if not text:
            continue
        y = PAGE_HEIGHT - MARGIN_Y - (row + 0.8) * LINE_HEIGHT
        ops.append(f"BT /{FONTS[kind]} {FONT_SIZE} Tf {COLOURS.get(kind, '0 g')} "
                   f"1 0 0 1 {MARGIN_X} {y:.2f} Tm {pdf_string(text)} Tj ET")
    return ("\n".join(ops) + "\n").encode("ascii")


def render(markdown):
    """The PDF's bytes: catalog, page tree, two fonts, the document info, then each page and its stream."""
    pages = layout(markdown)
    info = (f"<< /Title (ddpcourse cheat sheet) /Subject (cheatsheet.md sha256 {source_digest(markdown)}) "
            f"/Keywords ({PAPER}) /Creator (docs/make_printable.py) >>")
    kids = " ".join(f"{6 + 2 * n} 0 R" for n in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Courier /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Courier-Bold /Encoding /WinAnsiEncoding >>",
        info.encode("ascii"),
    ]
    for n, page in enumerate(pages):
        stream = page_stream(page)
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {PAGE_WIDTH:g} {PAGE_HEIGHT:g}] "
                       f"/Resources << /Font << /F1 3 0 R /F2 4 0 R >> >> /Contents {7 + 2 * n} 0 R >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"endstream")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 5 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def pdf_facts(path):
    """(pages, source digest) read back from a PDF this script wrote."""
    data = Path(path).read_bytes()
    pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", data))
    digest = re.search(rb"cheatsheet\.md sha256 ([0-9a-f]{64})", data)
    return pages, digest.group(1).decode() if digest else None


def problems(source=SOURCE, target=TARGET):
    """What is wrong with the printable form, as sentences; empty when it is up to date."""
    markdown = Path(source).read_text()
    found, pages = [], layout(markdown)
    if len(pages) > MAX_PAGES:
        found.append(f"{source.name} lays out on {len(pages)} pages (at most {MAX_PAGES})")
    wide = [text for page in pages for _, text in page if len(text) > MAX_CHARACTERS]
    if wide:
        found.append(f"{len(wide)} printed line(s) wider than {MAX_CHARACTERS} characters, e.g. {wide[0]!r}")
    if not Path(target).is_file():
        return found + [f"{target.name} is missing: run python docs/make_printable.py"]
    count, digest = pdf_facts(target)
    if digest != source_digest(markdown):
        found.append(f"{target.name} is older than {source.name}: run python docs/make_printable.py")
    elif Path(target).read_bytes() != render(markdown):
        found.append(f"{target.name} was made by another version of make_printable.py: run it again")
    if count > MAX_PAGES:
        found.append(f"{target.name} has {count} pages (at most {MAX_PAGES})")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the PDF is up to date")
    options = parser.parse_args()
    if not options.check:
        TARGET.write_bytes(render(SOURCE.read_text()))
    found = problems()
    for problem in found:
        print(problem)
    if not found:
        print(f"{TARGET.relative_to(DOCS.parent)}: {pdf_facts(TARGET)[0]} page(s) of {PAGE_WIDTH:g} x "
              f"{PAGE_HEIGHT:g} pt at {FONT_SIZE} pt, up to date")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
