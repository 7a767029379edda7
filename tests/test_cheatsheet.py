"""docs/cheatsheet.md and its printed form, docs/cheatsheet.pdf.

The print: up to date, at most two pages, 9 pt text on a page that fits inside both A4 and US Letter,
checked twice: from make_printable.py's own layout numbers, and from the PDF's bytes (each page's
MediaBox, each line's font size and position). The python blocks: each imports or defines every name it
uses (read with ``ast``) and runs as written in a world of one process. The facts: each sentence the
sheet states about torch (timeouts, ReduceOp.AVG, torch.load, torchrun's options, DDP's buckets and
buffers) is asserted against the torch installed here.

Cheap: one subprocess (the python blocks, a few seconds); the rest runs inside this process, the DDP
buffer checks in a process group of one.
"""
import ast
import builtins
import datetime
import importlib.util
import inspect
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.distributed as dist

from ddpcourse.paths import COURSE_ROOT
from helpers import section

DOCS = COURSE_ROOT / "docs"
CHEATSHEET = (DOCS / "cheatsheet.md").read_text()
POINTS_PER_MM = 72 / 25.4
A4 = (210 * POINTS_PER_MM, 297 * POINTS_PER_MM)    # 595.28 x 841.89 points
LETTER = (8.5 * 72, 11 * 72)                       # 612 x 792 points
MIN_FONT_SIZE = 9                                  # points: the smallest size a learner reads at a desk
COURIER_WIDTH = 0.6                                # em a character, every character of Courier

# Names a python block may use without importing or defining them: none. Every block brings its own
# imports and stand-ins (a tiny model, a list as the loader), so a learner can copy any one of them
# alone. A name added here must be one the sheet's prose defines, with the place it does so.
PLACEHOLDERS = set()


def printable():
    spec = importlib.util.spec_from_file_location("make_printable", DOCS / "make_printable.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks(markdown=CHEATSHEET):
    return re.findall(r"^```python\n(.*?)^```", markdown, re.S | re.M)


# ----------------------------------------------------------------------------- the printed form
def test_cheatsheet_prints_lines_of_at_most_100_characters_and_no_svg_links():
    long = [line for line in CHEATSHEET.splitlines() if len(line) > 100]
    assert not long, long
    assert ".svg" not in CHEATSHEET and "](" not in CHEATSHEET


def test_printable_cheatsheet_is_up_to_date_and_at_most_two_pages():
    make = printable()
    assert make.problems() == []
    pages, digest = make.pdf_facts(make.TARGET)
    assert pages == len(make.layout(CHEATSHEET)) <= 2
    assert digest == make.source_digest(CHEATSHEET)
    assert make.TARGET.read_bytes() == make.render(CHEATSHEET)  # the generator is deterministic: no date


def test_the_layout_fits_a4_and_letter_at_9_pt_or_more():
    """make_printable's own numbers: the page lies inside both papers, and the widest printed line and
    the fullest page fit inside its margins at its font size."""
    make = printable()
    assert make.FONT_SIZE >= MIN_FONT_SIZE and make.LINE_HEIGHT >= make.FONT_SIZE
    for paper in (A4, LETTER):
        assert make.PAGE_WIDTH <= paper[0] + 0.01 and make.PAGE_HEIGHT <= paper[1] + 0.01, paper
    # the largest such page: nothing left unused that a larger font could have had
    assert make.PAGE_WIDTH == pytest.approx(min(A4[0], LETTER[0]), abs=0.01)
    assert make.PAGE_HEIGHT == pytest.approx(min(A4[1], LETTER[1]), abs=0.01)
    pages = make.layout(CHEATSHEET)
    assert len(pages) <= 2
    widest = max(len(text) for page in pages for _, text in page)
    assert widest * COURIER_WIDTH * make.FONT_SIZE <= make.PAGE_WIDTH - 2 * make.MARGIN_X
    fullest = max(len(page) for page in pages)
    assert fullest * make.LINE_HEIGHT <= make.PAGE_HEIGHT - 2 * make.MARGIN_Y
    assert all("A4" in page[0][1] and "US Letter" in page[0][1] for page in pages)  # the header line says so
    assert "A4" in make.__doc__ and "US Letter" in make.__doc__ and "210 mm x 11 in" in make.__doc__


def pdf_pages(data):
    """[(media box, [(font size, x, y, text), ...]), ...]: each page of a PDF whose streams are plain."""
    objects = {int(number): body for number, body in re.findall(rb"(?m)^(\d+) 0 obj\n(.*?)\nendobj", data, re.S)}
    pages = []
    for body in objects.values():
        if not re.match(rb"<< /Type /Page\b(?!s)", body):
            continue
        box = [float(value) for value in re.search(rb"/MediaBox \[([^\]]*)\]", body).group(1).split()]
        content = objects[int(re.search(rb"/Contents (\d+) 0 R", body).group(1))]
        stream = re.search(rb"stream\n(.*)endstream", content, re.S).group(1)
        lines = []
        for size, x, y, text in re.findall(rb"/F\d+ ([\d.]+) Tf .*? 1 0 0 1 ([\d.]+) ([\d.]+) Tm \(((?:\\.|[^\\)])*)\) Tj",
                                           stream):
            text = re.sub(rb"\\(.)", rb"\1", text).decode("ascii")
            lines.append((float(size), float(x), float(y), text))
        assert stream.count(b" Tj") == len(lines), "a line drawn in a way this reader does not parse"
        pages.append((box, lines))
    return pages


def test_the_written_pdf_fits_a4_and_letter_at_9_pt_or_more():
    """Read back from docs/cheatsheet.pdf itself: every page's MediaBox fits inside both papers, every line
    is set at 9 pt or more and lies inside the page."""
    data = (DOCS / "cheatsheet.pdf").read_bytes()
    assert b"/Filter" not in data  # plain streams: what is read here is what prints
    pages = pdf_pages(data)
    assert 1 <= len(pages) <= 2 and len(pages) == len(re.findall(rb"/Type\s*/Page\b(?!s)", data))
    for number, ((left, bottom, right, top), lines) in enumerate(pages, 1):
        width, height = right - left, top - bottom
        for name, paper in (("A4", A4), ("US Letter", LETTER)):
            assert width <= paper[0] + 0.01 and height <= paper[1] + 0.01, f"page {number} is larger than {name}"
        assert len(lines) > 20, f"page {number} has {len(lines)} lines"
        assert "A4" in lines[0][3] and "US Letter" in lines[0][3], lines[0]  # the header line
        for size, x, y, text in lines:
            assert size >= MIN_FONT_SIZE, (size, text)
            assert x >= 18 and x + len(text) * COURIER_WIDTH * size <= width - 18, (x, text)  # 1/4 in free
            assert 18 <= y and y + size <= height - 18, (y, text)


# ----------------------------------------------------------------------------- the python blocks
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


def test_unbound_names_finds_a_module_used_without_its_import():
    assert unbound_names("import torch\nx = torch.ones(2)\nprint(len(x))") == set()
    assert unbound_names("import torch\ndist.all_reduce(torch.ones(1))") == {"dist"}
    assert unbound_names("model = DDP(net)") == {"DDP", "net"}
    assert unbound_names("import torch.distributed\ntorch.distributed.barrier()") == set()


def test_every_python_block_compiles_and_imports_what_it_uses():
    blocks = python_blocks()
    assert len(blocks) >= 4, "the sheet's python blocks were not found"
    for number, code in enumerate(blocks, 1):
        compile(code, f"python block {number}", "exec")
        missing = unbound_names(code) - PLACEHOLDERS
        assert not missing, f"python block {number} uses {sorted(missing)} without importing or defining them"


RUN_BLOCKS = """
import json, os, sys
import torch.distributed as dist

fsyncs, real_fsync = [], os.fsync
os.fsync = lambda fd: fsyncs.append(fd) or real_fsync(fd)
for number, code in enumerate(json.load(open(sys.argv[1])), 1):
    exec(compile(code, f"python block {number}", "exec"), {"__name__": "__main__"})
    assert not dist.is_initialized(), f"python block {number} leaves its process group open"
    print("ran block", number, flush=True)
print("fsync calls", len(fsyncs))
"""


def test_every_python_block_runs_as_written_in_a_world_of_one(tmp_path):
    """Each block on its own, in a fresh namespace, with the environment torchrun gives rank 0 of 1. The
    checkpoint block leaves ckpt.pt (written through a temporary file and fsync), loadable as weights."""
    blocks = python_blocks()
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run_blocks.py").write_text(RUN_BLOCKS)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=os.pathsep.join([str(COURSE_ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "run_blocks.py", "blocks.json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert [f"ran block {n}" for n in range(1, len(blocks) + 1)] == result.stdout.splitlines()[:-1]
    checkpoint = python_blocks(section(CHEATSHEET, "## 5. Checkpoints"))[0]
    assert "os.fsync(f.fileno())" in checkpoint and result.stdout.splitlines()[-1] == "fsync calls 1"
    assert not (tmp_path / "ckpt.pt.tmp").exists()
    assert set(torch.load(tmp_path / "ckpt.pt", weights_only=True)) == {"weight", "bias"}  # no "module." prefix


# ----------------------------------------------------------------------------- DDP's buffers
@pytest.fixture
def world_of_one():
    """A gloo process group of one rank inside this process, destroyed afterwards."""
    if dist.is_initialized():
        pytest.skip("a process group is already open in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def buffer_broadcasts(monkeypatch, steps, **options):
    """Wrap a BatchNorm model in DDP(**options) and run ``steps`` ("train", "no_grad" or "no_sync" forwards).
    Returns (whether DDP(...) broadcast the buffers, the warnings it gave, and for each step the
    authoritative ranks of the buffer broadcasts made before the module's own forward ran)."""
    from torch.nn.parallel import DistributedDataParallel, distributed

    constructor, real_sync = {}, distributed._sync_module_states

    def sync_module_states(**arguments):
        constructor["buffers"] = arguments["broadcast_buffers"]
        return real_sync(**arguments)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(distributed, "_sync_module_states", sync_module_states)
        warnings.simplefilter("always")
        ddp = DistributedDataParallel(model, **options)
    events = []
    real_broadcast = ddp._distributed_broadcast_coalesced
    ddp._distributed_broadcast_coalesced = lambda tensors, size, rank=0: (
        events.append(("broadcast", rank)), real_broadcast(tensors, size, rank))
    model.register_forward_pre_hook(lambda module, args: events.append(("forward", None)))
    log = []
    for step in steps:
        events.clear()
        x = torch.randn(4, 2)
        if step == "no_grad":
            with torch.no_grad():
                ddp(x)
        elif step == "no_sync":
            with ddp.no_sync():
                ddp(x).sum().backward()
        else:
            ddp(x).sum().backward()
        assert events[-1] == ("forward", None)  # every broadcast came before the module's forward
        log.append([rank for what, rank in events if what == "broadcast"])
    # a ResourceWarning is an earlier test's object collected meanwhile (a socket, a file), never DDP's
    said = [w.category.__name__ for w in caught if not issubclass(w.category, ResourceWarning)]
    return constructor["buffers"], said, log


def test_ddp_broadcasts_rank_0s_buffers_at_the_start_of_a_forward(world_of_one, monkeypatch):
    """What the sheet says of forward_sync_buffers and broadcast_buffers, on torch 2.13's own DDP."""
    steps = ["train", "train", "no_grad", "train", "train", "no_sync", "train"]
    synced = [[0], [0], [0], [], [0], [0], []]  # rank 0's, before the forward; none after no_grad or no_sync
    assert buffer_broadcasts(monkeypatch, steps) == (True, [], synced)
    assert buffer_broadcasts(monkeypatch, steps, forward_sync_buffers=True) == (True, [], synced)
    assert buffer_broadcasts(monkeypatch, steps, broadcast_buffers=True) == (True, ["FutureWarning"], synced)
    never = [[]] * len(steps)
    assert buffer_broadcasts(monkeypatch, steps, forward_sync_buffers=False) == (True, [], never)
    assert buffer_broadcasts(monkeypatch, steps, broadcast_buffers=False) == (False, ["FutureWarning"], never)


def test_the_cheatsheet_says_what_broadcast_buffers_means():
    from torch.nn.parallel import DistributedDataParallel

    ddp = " ".join(section(CHEATSHEET, "## 4. DistributedDataParallel").split())
    assert "start of a forward | broadcasts rank 0's buffers (BatchNorm running stats) to every rank" in ddp
    assert ("that broadcast is `forward_sync_buffers=True` (the default), skipped in a forward right after one "
            "under `no_sync()` or `torch.no_grad()`; each rank's batch then updates its own copy") in ddp
    assert ("`forward_sync_buffers` is new in torch 2.13 and replaces the deprecated `broadcast_buffers`, whose "
            "`False` also keeps buffers out of `DDP(model)`'s broadcast") in ddp
    # torch's own words for the two options
    doc = " ".join(DistributedDataParallel.__doc__.split())
    assert ("broadcast_buffers (bool or None): Flag that enables syncing (broadcasting) buffers of the module at "
            "beginning of the ``forward`` function. (default: ``None``) .. deprecated:: 2.13 Use "
            "``forward_sync_buffers`` instead.") in doc
    assert "Note: the deprecated ``broadcast_buffers=False`` excludes buffers from this init sync." in doc
    assert "Replaces the deprecated ``broadcast_buffers`` argument. When ``None``, defaults to ``True``." in doc
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    assert parameters["broadcast_buffers"].default is None and parameters["forward_sync_buffers"].default is None


# ----------------------------------------------------------------------------- facts against torch
def test_default_timeouts_per_backend_are_the_cheatsheets():
    from torch.distributed import constants
    from torch.distributed.distributed_c10d import _get_default_timeout

    assert constants.default_pg_timeout == datetime.timedelta(minutes=30)
    assert _get_default_timeout("gloo") == datetime.timedelta(minutes=30)
    nccl = constants.default_pg_nccl_timeout  # None on a CPU-only build: read torch's own documentation then
    if nccl is not None:
        assert nccl == datetime.timedelta(minutes=10)
    assert "Default value is 10 minutes for NCCL and 30 minutes for other backends" in " ".join(
        dist.init_process_group.__doc__.split())
    # the 10 minutes hold only for a backend of nccl alone (Backend() lower-cases "NCCL"): the course's mixed
    # string gets 30
    assert dist.Backend("NCCL") == dist.Backend.NCCL
    assert _get_default_timeout(dist.Backend("cpu:gloo,cuda:nccl")) == datetime.timedelta(minutes=30)
    assert "30 min; 10 only for nccl alone (any case, or CUDA `device_id`)." in CHEATSHEET


def test_forward_sync_buffers_is_new_in_torch_2_13():
    from torch.nn.parallel import DistributedDataParallel

    assert "forward_sync_buffers" in DistributedDataParallel.__init__.__code__.co_varnames
    assert ".. deprecated:: 2.13" in DistributedDataParallel.__doc__  # broadcast_buffers, replaced by it
    assert "`forward_sync_buffers` is new in torch 2.13" in CHEATSHEET


def allreduce_on_two_threads(op, values):
    """all_reduce `values[r]` on two gloo ranks inside this process (one thread each); returns each rank's result."""
    store, results = dist.HashStore(), {}

    def rank(r):
        group = dist.ProcessGroupGloo(store, r, 2, datetime.timedelta(seconds=30))
        options = dist.AllreduceOptions()
        options.reduceOp = op
        tensor = torch.tensor([values[r]])
        try:
            group.allreduce([tensor], options).wait()
            results[r] = tensor.item()
        except RuntimeError as error:
            results[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == [0, 1], f"an all_reduce did not finish within 30 s: only ranks {sorted(results)} returned"
    return results


def test_reduce_op_avg_works_on_gloo_for_floats_only():
    assert allreduce_on_two_threads(dist.ReduceOp.AVG, [1.0, 4.0]) == {0: 2.5, 1: 2.5}
    integers = allreduce_on_two_threads(dist.ReduceOp.AVG, [1, 4])
    assert len(integers) == 2 and all(isinstance(result, RuntimeError) for result in integers.values()), integers
    assert "with gloo only in recent releases" in CHEATSHEET and "float tensors" in CHEATSHEET


def test_torch_load_refuses_code_by_default_as_weights_only():
    buffer = io.BytesIO()
    torch.save({"weights": torch.ones(2), "extra": socket.AddressFamily}, buffer)  # any non-tensor global
    buffer.seek(0)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(buffer)
    assert "`weights_only=True` (the default since torch 2.6)" in CHEATSHEET


def test_every_torchrun_option_in_the_cheatsheet_exists():
    from torch.distributed.run import get_args_parser

    known = {option for action in get_args_parser()._actions for option in action.option_strings}
    mentioned = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", section(CHEATSHEET, "## 2. torchrun")))
    assert mentioned - {"--local-rank"} <= known, mentioned - known
    assert {"--max-restarts", "--nnodes", "--node-rank", "--rdzv-endpoint", "--local-addr"} <= mentioned


def test_ddp_bucket_sizes_are_the_cheatsheets():
    import torch.nn.parallel.distributed as ddp

    assert ddp._DEFAULT_BUCKET_CAP_MB == 25 and dist._DEFAULT_FIRST_BUCKET_BYTES == 1024 * 1024
    assert "_DEFAULT_FIRST_BUCKET_BYTES if is_using_default else" in inspect.getsource(ddp)
    assert "bucket_size_limits = [sys.maxsize]" in inspect.getsource(ddp)  # step 1: one bucket
    assert "one in step 1, then rebuilt in the order the gradients arrived, 25 MiB each" in CHEATSHEET
    assert "by default the first closes at 1 MiB, an explicit cap sets it too" in CHEATSHEET
