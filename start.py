#!/usr/bin/env python3
"""The README's Quick start: set the course up on first use, check the machine, open JupyterLab.

    python3 start.py           # .venv with the pinned packages, the doctor, JupyterLab on notebook 00
    python3 start.py test      # the whole test suite in that environment (extra words go to pytest)

Options (before `test`): --no-browser, --port N, --no-lab (set up and run the doctor only), --cuda (the
CUDA torch, Linux with an NVIDIA GPU), --wheels DIR (install from an instructor's wheel folder, offline).
DDPCOURSE_TORCH_INDEX_URL replaces the PyTorch CPU index (a machine that reaches packages only through
its own pip configuration sets it to its index).

Standard library only, and nothing newer than Python 3.6 before the version check: it runs before anything
is installed, sometimes under macOS's old /usr/bin/python3. Underneath it is venv and pip, step by step as
README's "Install by hand" shows; a second run finds the environment set up and starts in seconds.
"""
import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

COURSE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(COURSE, ".venv")
VENV_PYTHON = os.path.join(VENV, "bin", "python")
STAMP = os.path.join(VENV, "ddpcourse-setup.json")  # what was installed, so a second run skips pip
MIN_PYTHON = (3, 10)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_ENV = "DDPCOURSE_TORCH_INDEX_URL"
PIP_OWN_INDEX = "pip"  # DDPCOURSE_TORCH_INDEX_URL=pip: no index argument, pip's own configuration decides
NEEDS_GB = {"cpu": 3, "pypi": 3, "cuda": 10}  # a venv of 1.3 GB (CPU torch) plus pip's downloads and cache
FIRST_NOTEBOOK = "clean/00_start_here.ipynb"
NETWORK_ERRORS = ("Failed to establish a new connection", "Temporary failure in name resolution",
                  "Name or service not known", "nodename nor servname", "Network is unreachable",
                  "Could not fetch URL", "Connection refused", "Read timed out", "ProxyError")


class SetupError(Exception):
    """One sentence on what is wrong and the command that fixes it."""


# ----------------------------------------------------------------------------- the Python running this
def python_problem(version_info=None):
    """None when this Python can make the course's environment, else the sentence that says what to do."""
    version = tuple(version_info or sys.version_info)[:3]
    if version >= MIN_PYTHON:
        return None
    return ("Python %s is too old: the course needs 3.10 or newer. Install one (macOS: python.org's installer "
            "or `brew install python@3.12`; Ubuntu: `sudo apt install python3.12 python3.12-venv`) and run "
            "start.py with it, e.g. `python3.12 start.py`." % ".".join(map(str, version)))


def newer_python(names=("python3.13", "python3.12", "python3.11", "python3.10")):
    """A Python >= 3.10 on PATH that really runs (a pyenv shim may name a version it cannot start)."""
    for name in names:
        path = shutil.which(name)
        if path and subprocess.run([path, "-c", "import sys; sys.exit(sys.version_info < (3, 10))"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return path
    return None


# ----------------------------------------------------------------------------- which torch this system gets
def running_in_wsl():
    return "microsoft" in platform.release().lower()


def under_rosetta():
    """An x86_64 Python on an Apple Silicon Mac (the sysctl says 1): it would look like an Intel Mac."""
    probe = subprocess.run(["sysctl", "-n", "sysctl.proc_translated"], capture_output=True, text=True)
    return probe.stdout.strip() == "1"


def torch_source(system, machine, wsl=False, rosetta=False, cuda=False, environ=None):
    """(variant, index URL or None for pip's own) for this system, or SetupError with what to do instead.
    Linux and WSL get the CPU build unless --cuda; macOS arm64 gets PyPI's (already CPU-only)."""
    environ = os.environ if environ is None else environ
    if system == "Windows":
        raise SetupError("native Windows is not supported (its gloo and signals differ): in an administrator "
                         "PowerShell run `wsl --install`, restart, open Ubuntu, clone the course there "
                         "(`~/ddpcourse`, not /mnt/c) and run the quick start inside it.")
    if system == "Darwin":
        if rosetta:
            raise SetupError("this Python is an Intel build running under Rosetta on an Apple Silicon Mac: "
                             "install the arm64 (universal2) Python from python.org and run start.py with it.")
        if machine != "arm64":
            raise SetupError("an Intel Mac cannot run the course: torch publishes no macOS x86_64 wheel after "
                             "2.2.2 and the course needs 2.13. Use a Linux machine or your workshop's server "
                             "(README, \"Intel Macs\").")
        if cuda:
            raise SetupError("--cuda: macOS has no CUDA; run `python3 start.py` without it.")
        return "pypi", None
    if system != "Linux":
        raise SetupError("%s is not a system the course is tested on: use Linux, macOS (Apple Silicon) or "
                         "WSL2." % system)
    if cuda:
        return "cuda", None  # PyPI's Linux torch is the CUDA build
    chosen = environ.get(INDEX_ENV) or CPU_INDEX
    return "cpu", None if chosen == PIP_OWN_INDEX else chosen


def this_torch_source(cuda=False):
    system = platform.system()
    return torch_source(system, platform.machine(), wsl=system == "Linux" and running_in_wsl(),
                        rosetta=system == "Darwin" and under_rosetta(), cuda=cuda)


# ----------------------------------------------------------------------------- the environment
def disk_problem(folder, variant, free_bytes=None):
    free = shutil.disk_usage(folder).free if free_bytes is None else free_bytes
    need = NEEDS_GB[variant]
    if free >= need * 1024 ** 3:
        return None
    return ("only %.1f GB free on this disk and the course's environment needs about %d GB: free some space "
            "(or move the course folder to a disk with room) and run again." % (free / 1024 ** 3, need))


def venv_problem(output, version_info=None):
    """The sentence for a failed `python -m venv`; Debian and Ubuntu ship venv as a separate package."""
    major, minor = tuple(version_info or sys.version_info)[:2]
    if "ensurepip" in output or "No module named venv" in output:
        return ("this Python cannot make virtual environments (Debian and Ubuntu ship that separately): run "
                "`sudo apt update && sudo apt install python3-venv python%d.%d-venv`, then run again."
                % (major, minor))
    return "making the virtual environment .venv failed (above): remove .venv and run again."


def pip_problem(output, wheels=None):
    """The sentence for a failed pip install, from its output."""
    if "No space left on device" in output:
        return "the disk filled up while installing: free a few GB, `rm -rf .venv`, and run again."
    if any(text in output for text in NETWORK_ERRORS):
        return ("pip could not reach the package index (no network, or a proxy or VPN in the way): connect and "
                "run again, or install from your instructor's wheel folder: `python3 start.py --wheels "
                "PATH/TO/wheels-FOLDER`. Inside WSL behind a VPN, DNS often fails: add `dnsTunneling=true` under "
                "[wsl2] in %UserProfile%\\.wslconfig, run `wsl --shutdown` in PowerShell, and try again.")
    missing = re.search(r"No matching distribution found for (\S+)", output)
    if missing and wheels:
        return ("the wheel folder %s has no %s for Python %d.%d on this system: ask for the folder made for "
                "it (docs/instructors.md, \"Offline install\")." % (wheels, missing.group(1), *sys.version_info[:2]))
    if missing:
        return ("no %s for Python %d.%d on this system: use Python 3.10 to 3.13 (README, Quick start)."
                % (missing.group(1), *sys.version_info[:2]))
    return "pip failed (its output is above); run again after fixing what it says."


def torch_build_problem(version, cuda_version, variant):
    """A CUDA torch where the CPU build is wanted (or the other way round) is a wrong environment."""
    if variant == "cpu" and cuda_version:
        return ("this environment holds a CUDA build of torch (%s, several GB) and the course needs the CPU "
                "build: `rm -rf .venv && python3 start.py`; on a machine with an NVIDIA GPU keep it with "
                "`python3 start.py --cuda`." % version)
    if variant == "cuda" and not cuda_version:
        return ("--cuda asked for the CUDA torch but this environment holds %s: `rm -rf .venv && python3 "
                "start.py --cuda`." % version)
    return None


def requirement_pin(name, path=os.path.join(COURSE, "requirements.txt")):
    with open(path) as file:
        return re.search(r"^%s==(\S+)" % re.escape(name), file.read(), re.M).group(1)


def setup_fingerprint(variant):
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        with open(os.path.join(COURSE, name), "rb") as file:
            digest.update(file.read())
    return {"inputs": digest.hexdigest(), "torch": variant}


def run_pip(args, wheels):
    """pip in .venv, its output shown live and kept for the diagnosis."""
    if wheels:
        args = args + ["--no-index", "--find-links", wheels]
    command = [VENV_PYTHON, "-m", "pip", "install", "--disable-pip-version-check"] + args
    print("start.py: " + " ".join(command[2:]), flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        output.append(line)
        sys.stdout.write(line)
    if process.wait() != 0:
        raise SetupError(pip_problem("".join(output), wheels))


def ensure_environment(cuda=False, wheels=None):
    """.venv with the pinned packages; returns at once when a previous run installed the same inputs."""
    variant, index = this_torch_source(cuda)
    wanted = setup_fingerprint(variant)
    if os.path.exists(STAMP):
        with open(STAMP) as file:
            if json.load(file) == wanted and os.path.exists(VENV_PYTHON):
                return
    if wheels and not os.path.isdir(wheels):
        raise SetupError("--wheels %s: no such folder." % wheels)
    if not os.path.exists(VENV_PYTHON):
        problem = disk_problem(COURSE, variant)
        if problem:
            raise SetupError(problem)
        print("start.py: making the virtual environment .venv (first run: a few minutes)", flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", VENV], capture_output=True, text=True)
        if made.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)  # half a venv would look set up next time
            sys.stderr.write(made.stdout + made.stderr)
            raise SetupError(venv_problem(made.stdout + made.stderr))
    torch_args = ["torch==" + requirement_pin("torch")] + (["--index-url", index] if index and not wheels else [])
    run_pip(torch_args, wheels)
    run_pip(["-r", os.path.join(COURSE, "requirements.txt")], wheels)
    probe = subprocess.run([VENV_PYTHON, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True, check=True)
    version, cuda_version = probe.stdout.split()
    problem = torch_build_problem(version, None if cuda_version == "None" else cuda_version, variant)
    if problem:
        raise SetupError(problem)
    with open(STAMP, "w") as file:
        json.dump(wanted, file)


def environment_variables():
    """What `source .venv/bin/activate` would set: `python` and `ddpcourse` in JupyterLab's terminal are ours."""
    env = dict(os.environ, VIRTUAL_ENV=VENV)
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    return env


# ----------------------------------------------------------------------------- JupyterLab
def free_port(preferred=8888, host="127.0.0.1"):
    """8888 when free, else the next free one (a second JupyterLab often holds 8888)."""
    for port in list(range(preferred, preferred + 20)) + [0]:
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise SetupError("no free TCP port on this machine for JupyterLab.")


# JupyterLab asks every new learner whether to fetch Jupyter's news (a pop-up over notebook 00); the course
# answers no for them, in the environment's own settings (the learner can still change it in Settings).
LAB_SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def quiet_jupyterlab():
    """Write the course's JupyterLab settings overrides into the environment (.venv/share/jupyter/lab)."""
    folder = os.path.join(VENV, "share", "jupyter", "lab", "settings")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "overrides.json"), "w") as f:
        json.dump(LAB_SETTINGS, f, indent=2)


def jupyterlab_command(port, browser=True, root=False):
    # default_url, not a file argument: the address JupyterLab prints (what --no-browser, WSL2, SSH and
    # Codespaces users click) then opens notebook 00 too, not the Launcher.
    command = [VENV_PYTHON, "-m", "jupyter", "lab", "--ServerApp.root_dir=.", "--ServerApp.port=%d" % port,
               "--ServerApp.port_retries=0", "--LabApp.default_url=/lab/tree/" + FIRST_NOTEBOOK]
    # JupyterLab refuses root without --allow-root; containers (a devcontainer, a Codespace) often run as root
    return command + ([] if browser else ["--no-browser"]) + (["--allow-root"] if root else [])


def build_parser():
    parser = argparse.ArgumentParser(prog="python3 start.py", description=__doc__.split("\n")[0],
                                     epilog="`python3 start.py test [pytest arguments]` runs the test suite "
                                            "in the course's environment (set up first when needed).")
    parser.add_argument("--no-browser", action="store_true", help="print JupyterLab's address, open no browser")
    parser.add_argument("--port", type=int, help="JupyterLab's port (default: 8888, or the next free one)")
    parser.add_argument("--no-lab", action="store_true", help="set up and run the doctor, no JupyterLab")
    parser.add_argument("--cuda", action="store_true", help="the CUDA torch (Linux with an NVIDIA GPU)")
    parser.add_argument("--wheels", help="install from this wheel folder only (offline rooms)")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    problem = python_problem()
    if problem and not os.path.exists(VENV_PYTHON):
        other = newer_python()
        if other is None:
            raise SetupError(problem)
        print("start.py: Python %d.%d is too old, using %s" % (sys.version_info[0], sys.version_info[1], other))
        os.execv(other, [other, os.path.abspath(__file__)] + argv)
    split = argv.index("test") if "test" in argv else len(argv)
    options, test_args = build_parser().parse_args(argv[:split]), argv[split + 1:]
    os.chdir(COURSE)
    ensure_environment(options.cuda, options.wheels and os.path.abspath(options.wheels))
    env = environment_variables()
    if split < len(argv):
        os.execve(VENV_PYTHON, [VENV_PYTHON, "-m", "pytest"] + test_args, env)
    if subprocess.run([VENV_PYTHON, "-m", "ddpcourse", "doctor"], env=env).returncode != 0:
        raise SetupError("the doctor found a problem: each FAIL line above says how to fix it.")
    if options.no_lab:
        return
    quiet_jupyterlab()
    port = options.port or free_port()
    print("start.py: JupyterLab on port %d; open the address it prints below (Ctrl+C twice stops it)" % port,
          flush=True)
    command = jupyterlab_command(port, browser=not options.no_browser, root=os.geteuid() == 0)
    os.execve(VENV_PYTHON, command, env)


if __name__ == "__main__":
    try:
        main()
    except SetupError as error:
        sys.stderr.write("start.py: %s\n" % error)
        sys.exit(1)
