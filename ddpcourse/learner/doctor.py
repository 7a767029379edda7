"""``python -m ddpcourse doctor``: is this machine ready for the course? One line per check.

Introduced in notebooks/00_start_here.ipynb. An instructor runs it on every laptop before a workshop.
Each line is OK (green), FAIL (red, with the fix) or INFO (worth knowing, nothing to fix).
The packages the notebook kernel and the labs import must be the pinned versions (FAIL otherwise); the
tooling around them (JupyterLab, nbval, pytest) may live in another environment, so a different version
there is INFO. In a notebook: ``from ddpcourse import doctor; doctor()`` (ddpcourse.learner.api).
"""
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass, field
from importlib import metadata

from ddpcourse.paths import COURSE_ROOT

CPU_TORCH = "pip install torch=={v} --index-url https://download.pytorch.org/whl/cpu"
# What the kernel and the labs import: a different version changes what the notebooks show.
KERNEL_PACKAGES = ("torch", "ipywidgets", "matplotlib", "psutil")


@dataclass
class Row:
    name: str
    status: str  # "OK", "FAIL" or "INFO"
    value: str
    fix: str = ""


@dataclass
class DoctorReport:
    rows: list = field(default_factory=list)

    @property
    def ok(self):
        return all(row.status != "FAIL" for row in self.rows)

    def row(self, name):
        return next(row for row in self.rows if row.name == name)

    def __repr__(self):
        return f"DoctorReport({'all checks passed' if self.ok else 'some checks FAILED'})"


def pins(path=None, python=None):
    """{package: version} from requirements.txt, the single list of tested versions, for this Python (or
    `python`, "3.10"): a line with a `; python_version ...` marker counts only where its marker holds."""
    from packaging.markers import Marker

    path = path or COURSE_ROOT / "requirements.txt"
    environment = {"python_version": python or platform.python_version().rsplit(".", 1)[0]}
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s;#]+)\s*(?:;([^#]*))?", line)
        if match and (match.group(3) is None or Marker(match.group(3)).evaluate(environment)):
            found[match.group(1).lower()] = match.group(2)
    return found


def _installed(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _package_rows(report):
    wanted = pins() if (COURSE_ROOT / "requirements.txt").exists() else {}
    for package, pin in wanted.items():
        have = _installed(package)
        fix = CPU_TORCH.format(v=pin) if package == "torch" else f"pip install {package}=={pin}"
        if have is not None and have.split("+")[0] == pin:  # 2.13.0+cpu is the CPU build of 2.13.0
            report.rows.append(Row(package, "OK", have))
        elif package in KERNEL_PACKAGES:
            found = "not installed" if have is None else f"{have}, the course is tested with {pin}"
            report.rows.append(Row(package, "FAIL", found, fix))
        else:  # tooling: fine from another environment (say, a JupyterLab installed once for all projects)
            found = "not in this environment" if have is None else f"{have} (the course is tested with {pin})"
            report.rows.append(Row(package, "INFO", found + "; fine if it runs from another environment"))


def _torch_rows(report):
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        report.rows.append(Row("torch import", "FAIL", str(exc), CPU_TORCH.format(v=pins().get("torch", ""))))
        return False
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    report.rows.append(Row("GPUs", "INFO", f"{gpus}" + (f" ({names})" if names else
                                                       ": every lab runs on CPU with gloo")))
    ok_gloo = dist.is_available() and dist.is_gloo_available()
    report.rows.append(Row("backend gloo", "OK" if ok_gloo else "FAIL", "available" if ok_gloo else "missing",
                           "" if ok_gloo else "install an official torch build (gloo ships with it)"))
    nccl = dist.is_available() and dist.is_nccl_available()
    report.rows.append(Row("backend nccl", "INFO", "available" if nccl else "not in this build (CUDA only)"))
    mpi = dist.is_available() and dist.is_mpi_available()
    report.rows.append(Row("backend mpi", "INFO", "available" if mpi else "not in this build (needs torch built from source)"))
    return ok_gloo


ALLREDUCE_SCRIPT = os.path.join(os.path.dirname(__file__), "doctor_allreduce.py")


def _allreduce_row(report, nproc=2):
    from ddpcourse.launch.launcher import DEFAULT_TIMEOUT, run

    result = run(ALLREDUCE_SCRIPT, nproc=nproc, timeout=DEFAULT_TIMEOUT, show="none")
    want = float(sum(range(nproc)))
    if result.ok and result.values("total") == [want] * nproc:
        backend = result.values("backend")[0]
        report.rows.append(Row(f"{nproc}-process all_reduce", "OK",
                               f"{backend}, sum {want:g} on every rank, {result.duration:.1f} s"))
    else:
        report.rows.append(Row(f"{nproc}-process all_reduce", "FAIL", result.message.splitlines()[0][:200],
                               "see README 'Troubleshooting'; try `python -m ddpcourse run "
                               f"{os.path.relpath(ALLREDUCE_SCRIPT, COURSE_ROOT)} --nproc 2` to see every rank's output"))


WSL_FIX = ("in an administrator PowerShell run `wsl --install`, restart, open Ubuntu, clone the course into "
           "~/ddpcourse and run README's quick start there")


def platform_row(system, machine, release, course_root):
    """Native Windows fails (untested: its gloo needs USE_LIBUV=0 and it has no SIGUSR1 for a hung rank's
    stack); WSL2 is Linux, slow only when the course lies on the Windows disk (/mnt/c)."""
    name = f"{system} {machine}"
    if system == "Windows":
        return Row("platform", "FAIL", f"{name}: native Windows is not supported", WSL_FIX)
    if system == "Linux" and "microsoft" in release.lower():
        slow = course_root.startswith("/mnt/")
        return Row("platform", "INFO", f"{name} (WSL2)" + (
            f"; the course is on the Windows disk ({course_root}): move it to ~/ddpcourse, it runs much faster"
            if slow else ""))
    return Row("platform", "INFO", name)


def check_environment(launch=True):
    """Collect the rows without printing them."""
    report = DoctorReport()
    version = platform.python_version()
    good_python = sys.version_info >= (3, 10)
    report.rows.append(Row("python", "OK" if good_python else "FAIL", f"{version} ({sys.executable})",
                           "" if good_python else "use Python 3.10 or newer (environment.yml pins 3.11)"))
    report.rows.append(platform_row(platform.system(), platform.machine(), platform.release(), str(COURSE_ROOT)))
    cores = os.cpu_count() or 1
    report.rows.append(Row("CPU cores", "OK" if cores >= 2 else "INFO", str(cores),
                           "" if cores >= 2 else "1 core: labs still run, just slower"))
    _package_rows(report)
    try:
        loopback = socket.gethostbyname("localhost")
        report.rows.append(Row("localhost", "OK" if loopback.startswith("127.") else "FAIL", loopback,
                               "" if loopback.startswith("127.") else "add '127.0.0.1 localhost' to /etc/hosts"))
    except OSError as exc:
        report.rows.append(Row("localhost", "FAIL", str(exc), "add '127.0.0.1 localhost' to /etc/hosts"))
    if _torch_rows(report) and launch:
        _allreduce_row(report)
    return report


def format_report(report, color=True):
    paint = {"OK": "32", "FAIL": "31", "INFO": "36"}
    width = max(len(row.name) for row in report.rows)
    lines = []
    for row in report.rows:
        mark = f"\033[{paint[row.status]}m{row.status:<4}\033[0m" if color else f"{row.status:<4}"
        lines.append(f"{mark}  {row.name:<{width}}  {row.value}")
        if row.fix and row.status == "FAIL":
            lines.append(f"      {'':<{width}}  fix: {row.fix}")
    verdict = "ready for the course" if report.ok else "NOT ready: apply the fixes above"
    lines.append(f"{sum(r.status == 'FAIL' for r in report.rows)} failed: {verdict}.")
    return "\n".join(lines)


def doctor(launch=True):
    """Check this machine, print the table, return the DoctorReport."""
    report = check_environment(launch)
    print(format_report(report, color=sys.stdout.isatty() or "ipykernel" in sys.modules))
    return report

