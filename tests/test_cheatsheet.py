"""docs/cheatsheet.md and its printed form, docs/cheatsheet.pdf.

The files (docs/lint/cheatsheet.py, whose docstring states the rules): the print is up to date, at most two
pages, 9 pt text on a page inside both A4 and US Letter, by make_printable.py's numbers and by the PDF's
bytes; each python block imports or defines every name it uses. Here besides: each python block runs as
written in a world of one process, and each sentence the sheet states about torch (timeouts, ReduceOp.AVG,
torch.load, torchrun's options, DDP's buckets and buffers) is asserted against the torch installed here.

Cheap: one subprocess (the python blocks, a few seconds); the rest runs inside this process, the DDP
buffer checks in a process group of one.
"""
import datetime
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
from helpers import docs_tool, section

lint = docs_tool("docs/lint/cheatsheet.py")
CHEATSHEET = lint.cheatsheet()


# ----------------------------------------------------------------------------- the files (docs/lint/cheatsheet.py)
def test_cheatsheet_prints_lines_of_at_most_100_characters_and_no_svg_links():
    assert lint.line_problems(CHEATSHEET) == []


def test_printable_cheatsheet_is_up_to_date_and_at_most_two_pages():
    assert lint.printable_problems() == []


def test_the_layout_fits_a4_and_letter_at_9_pt_or_more():
    """make_printable's own numbers: the page lies inside both papers, and the widest printed line and
    the fullest page fit inside its margins at its font size."""
    assert lint.layout_problems() == []


def test_the_written_pdf_fits_a4_and_letter_at_9_pt_or_more():
    """Read back from docs/cheatsheet.pdf itself: every page's MediaBox fits inside both papers, every line
    is set at 9 pt or more and lies inside the page."""
    assert lint.pdf_problems((COURSE_ROOT / "docs" / "cheatsheet.pdf").read_bytes()) == []


def test_unbound_names_finds_a_module_used_without_its_import():
    assert lint.unbound_names("import torch\nx = torch.ones(2)\nprint(len(x))") == set()
    assert lint.unbound_names("import torch\ndist.all_reduce(torch.ones(1))") == {"dist"}
    assert lint.unbound_names("model = DDP(net)") == {"DDP", "net"}
    assert lint.unbound_names("import torch.distributed\ntorch.distributed.barrier()") == set()


def test_every_python_block_compiles_and_imports_what_it_uses():
    assert lint.python_block_problems(CHEATSHEET) == []


# ----------------------------------------------------------------------------- the python blocks, run
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
    blocks = lint.python_blocks(CHEATSHEET)
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
    checkpoint = lint.python_blocks(section(CHEATSHEET, "## 5. Checkpoints"))[0]
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
