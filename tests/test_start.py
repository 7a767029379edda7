"""start.py, the README's Quick start: which torch each system gets, each failure's sentence, and the two
README lines run under bash and zsh on a fresh copy of the course.

CI (`.ci/run`) runs the second line on a clean clone, so every CI run sets the course up from nothing
(venv, pip, the CPU torch) before this file runs in the environment it made. Here the fresh copy shares
that environment (`.venv` linked), and the first line's second run is what is timed: doctor, then
JupyterLab answering.
"""
import ast
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ddpcourse.learner.doctor import ALLREDUCE_SCRIPT, WSL_FIX, platform_row
from ddpcourse.paths import COURSE_ROOT

README = (COURSE_ROOT / "README.md").read_text()


def load_start():
    spec = importlib.util.spec_from_file_location("start", COURSE_ROOT / "start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


start = load_start()


def quick_start_lines():
    block = re.search(r"<!-- quick-start -->\s*```bash\n(.*?)```", README, re.S).group(1)
    return block.strip().splitlines()


def test_the_quick_start_is_two_plain_command_lines_and_its_second_is_what_ci_runs():
    lines = quick_start_lines()
    assert lines == ["python3 start.py", "python3 start.py test"]  # no `#` comments: zsh would pass them on
    assert README.index("## Quick start") < README.index("## Course map")
    ci = (COURSE_ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("python3 ")] == [lines[1]]


# ----------------------------------------------------------------------------- which torch each system gets
@pytest.mark.parametrize("system, machine, wsl, cuda, expected", [
    ("Linux", "x86_64", False, False, ("cpu", start.CPU_INDEX)),
    ("Linux", "x86_64", True, False, ("cpu", start.CPU_INDEX)),   # WSL2 is Linux: CPU-only too
    ("Linux", "aarch64", False, False, ("cpu", start.CPU_INDEX)),
    ("Linux", "x86_64", False, True, ("cuda", None)),             # PyPI's Linux torch is the CUDA build
    ("Darwin", "arm64", False, False, ("pypi", None)),            # PyPI's macOS torch is CPU (and MPS) only
])
def test_each_supported_system_gets_its_torch(system, machine, wsl, cuda, expected):
    assert start.torch_source(system, machine, wsl=wsl, cuda=cuda, environ={}) == expected


def test_an_environment_variable_replaces_the_cpu_index():
    custom = {start.INDEX_ENV: "https://mirror.example/simple"}
    assert start.torch_source("Linux", "x86_64", environ=custom) == ("cpu", "https://mirror.example/simple")


def test_pip_as_the_index_leaves_the_choice_to_pips_own_configuration():
    # what CI sets: its machine reaches packages only through pip's configuration; the build check after the
    # install still refuses a CUDA torch there
    assert start.torch_source("Linux", "x86_64", environ={start.INDEX_ENV: "pip"}) == ("cpu", None)
    ci = (COURSE_ROOT / ".ci" / "run").read_text()
    assert "DDPCOURSE_TORCH_INDEX_URL=pip\n" in ci and "://" not in ci


@pytest.mark.parametrize("system, machine, rosetta, cuda, says", [
    ("Windows", "AMD64", False, False, "`wsl --install`"),
    ("Darwin", "x86_64", False, False, "an Intel Mac cannot run the course"),
    ("Darwin", "x86_64", True, False, "under Rosetta"),
    ("Darwin", "arm64", False, True, "macOS has no CUDA"),
    ("FreeBSD", "amd64", False, False, "not a system the course is tested on"),
])
def test_unsupported_systems_get_one_sentence_and_the_way_out(system, machine, rosetta, cuda, says):
    with pytest.raises(start.SetupError, match=re.escape(says)):
        start.torch_source(system, machine, rosetta=rosetta, cuda=cuda, environ={})


def test_the_doctor_sends_native_windows_to_wsl2_and_warns_of_the_windows_disk():
    windows = platform_row("Windows", "AMD64", "10", r"C:\ddpcourse")
    assert windows.status == "FAIL" and "wsl --install" in windows.fix == WSL_FIX
    assert platform_row("Linux", "x86_64", "6.1.0", "/home/a/ddpcourse").value == "Linux x86_64"
    wsl = platform_row("Linux", "x86_64", "5.15.167.4-microsoft-standard-WSL2", "/mnt/c/Users/a/ddpcourse")
    assert wsl.status == "INFO" and "(WSL2)" in wsl.value and "move it to ~/ddpcourse" in wsl.value
    assert Path(ALLREDUCE_SCRIPT).is_file()  # the doctor's 2-process all_reduce runs this file


# ----------------------------------------------------------------------------- each failure's sentence
OLD_PYTHONS = sorted(Path("~/.pyenv/versions").expanduser().glob("3.[6-9].*/bin/python3"))


OLDEST_PARSER = (3, 6)  # start.py's docstring: "nothing newer than Python 3.6 before the version check"


def test_start_py_parses_as_the_oldest_python_it_claims_to_answer():
    """An old interpreter must get as far as the version check: start.py's syntax is 3.6's (ast checks it at
    that feature version here, with no old interpreter installed), and the check bites on newer syntax."""
    source = (COURSE_ROOT / "start.py").read_text()
    assert "nothing newer than Python %d.%d before the version check" % OLDEST_PARSER in source
    ast.parse(source, feature_version=OLDEST_PARSER)
    for newer in ("(x := 1)", "def f(a, /): pass", "print(f'{x=}')"):  # 3.8 syntax
        with pytest.raises(SyntaxError):
            ast.parse(source + "\n" + newer + "\n", feature_version=OLDEST_PARSER)


def test_too_old_a_python_says_which_and_how_to_get_a_newer_one(tmp_path):
    assert start.python_problem((3, 11, 7)) is None
    assert "Python 3.9.6 is too old" in start.python_problem((3, 9, 6))
    if not OLD_PYTHONS:
        pytest.skip("no Python 3.6-3.9 installed here to run start.py under (its syntax: the test above)")
    shutil.copy(COURSE_ROOT / "start.py", tmp_path)
    old = OLD_PYTHONS[-1]
    (tmp_path / "empty").mkdir()  # PATH without a newer python3.1x, so start.py cannot hand over to one
    done = subprocess.run([str(old), "start.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH=str(tmp_path / "empty")))
    assert done.returncode == 1 and "is too old: the course needs 3.10 or newer" in done.stderr, done.stderr


def test_an_old_python_hands_over_to_a_newer_one_on_path(tmp_path, monkeypatch):
    (tmp_path / "python3.13").write_text("#!/bin/sh\nexit 1\n")  # a pyenv shim that cannot start its version
    os.symlink(sys.executable, tmp_path / "python3.12")
    for name in ("python3.13", "python3.12"):
        os.chmod(tmp_path / name, 0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert start.newer_python() == str(tmp_path / "python3.12")


@pytest.fixture
def course_copy(tmp_path, monkeypatch):
    """start.py's view of a course folder in tmp_path: its inputs copied, .venv not yet made."""
    for name in ("requirements.txt", "pyproject.toml"):
        shutil.copy(COURSE_ROOT / name, tmp_path)
    monkeypatch.setattr(start, "COURSE", str(tmp_path))
    monkeypatch.setattr(start, "VENV", str(tmp_path / ".venv"))
    monkeypatch.setattr(start, "VENV_PYTHON", str(tmp_path / ".venv" / "bin" / "python"))
    monkeypatch.setattr(start, "STAMP", str(tmp_path / ".venv" / "ddpcourse-setup.json"))
    monkeypatch.setattr(start, "this_torch_source", lambda cuda=False: ("cpu", start.CPU_INDEX))
    return tmp_path


def test_a_full_disk_stops_before_anything_is_made(course_copy, monkeypatch):
    monkeypatch.setattr(start.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 9, 1024 ** 3))
    with pytest.raises(start.SetupError, match=r"only 1\.0 GB free on this disk .* needs about 3 GB"):
        start.ensure_environment()
    assert not (course_copy / ".venv").exists()


def test_a_python_without_venv_support_prints_the_apt_line(course_copy, monkeypatch):
    """Debian and Ubuntu strip ensurepip from the system Python, and `python -m venv` then fails, leaving
    half a .venv. Here a Python that does exactly that (its message is Debian's) makes the environment."""
    debian = ("The virtual environment was not created successfully because ensurepip is not\n"
              "available.  On Debian/Ubuntu systems, you need to install the python3-venv\npackage")
    fake = course_copy / "debian-python"
    fake.write_text(f"#!/bin/sh\nmkdir -p \"$3/bin\"\necho '{debian}'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setattr(start, "run_pip", lambda *args: pytest.fail("pip ran after venv failed"))
    with pytest.raises(start.SetupError) as failure:
        start.ensure_environment()
    major, minor = sys.version_info[:2]
    assert f"sudo apt update && sudo apt install python3-venv python{major}.{minor}-venv" in str(failure.value)
    assert not (course_copy / ".venv").exists()  # half a venv would look set up next time


def test_no_network_points_to_the_wheel_folder(tmp_path):
    """Real pip output, from an index nobody answers on."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path), "--retries", "1",
             "--index-url", f"http://127.0.0.1:{port}/simple", "ddpcourse-not-a-package==1.0"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_EXTRA_INDEX_URL=""))
    assert pip.returncode != 0
    sentence = start.pip_problem(pip.stdout + pip.stderr)
    assert sentence.startswith("pip could not reach the package index"), pip.stdout + pip.stderr
    assert "python3 start.py --wheels" in sentence and "dnsTunneling=true" in sentence
    wrong_folder = start.pip_problem("ERROR: No matching distribution found for torch==2.13.0", wheels="w")
    assert "the wheel folder w has no torch==2.13.0" in wrong_folder
    assert "free a few GB" in start.pip_problem("OSError: [Errno 28] No space left on device")


def test_a_cuda_torch_where_the_cpu_build_is_wanted_is_named_with_its_fix():
    assert start.torch_build_problem("2.13.0+cpu", None, "cpu") is None
    assert start.torch_build_problem("2.13.0", None, "pypi") is None  # macOS
    assert start.torch_build_problem("2.13.0", "12.8", "cuda") is None
    cuda = start.torch_build_problem("2.13.0", "12.8", "cpu")
    assert "CUDA build of torch (2.13.0" in cuda and "rm -rf .venv && python3 start.py" in cuda
    assert "--cuda" in start.torch_build_problem("2.13.0+cpu", None, "cuda")


def test_a_second_run_skips_pip_when_the_inputs_are_unchanged(course_copy, monkeypatch):
    (course_copy / ".venv" / "bin").mkdir(parents=True)
    (course_copy / ".venv" / "bin" / "python").touch()
    (course_copy / ".venv" / "ddpcourse-setup.json").write_text(json.dumps(start.setup_fingerprint("cpu")))
    monkeypatch.setattr(start, "run_pip", lambda *args: pytest.fail("pip ran although nothing changed"))
    start.ensure_environment()
    with open(course_copy / "requirements.txt", "a") as requirements:
        requirements.write("# changed\n")
    ran = []
    monkeypatch.setattr(start, "run_pip", lambda args, wheels: ran.append(args))
    monkeypatch.setattr(start.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "2.13.0+cpu None"))
    start.ensure_environment()
    assert ran == [["torch==" + start.requirement_pin("torch"), "--index-url", start.CPU_INDEX],
                   ["-r", str(course_copy / "requirements.txt")]]


def _binds(port):
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_8888_when_free_and_the_next_free_port_when_taken():
    if _binds(8888):
        assert start.free_port() == 8888
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 8888))
        except OSError:
            pass  # something else holds it already: the same situation
        expected = next(port for port in range(8889, 8908) if _binds(port))
        assert start.free_port() == expected


def test_jupyterlab_asks_no_news_question(course_copy):
    """The news pop-up JupyterLab shows a new user is answered in the environment's settings overrides."""
    start.quiet_jupyterlab()
    written = json.loads((course_copy / ".venv" / "share" / "jupyter" / "lab" / "settings" / "overrides.json").read_text())
    assert written["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false", "checkForUpdates": False}
    schema = COURSE_ROOT / ".venv" / "share" / "jupyter" / "lab" / "schemas" / "@jupyterlab" / "apputils-extension"
    if (schema / "notification.json").exists():  # the installed JupyterLab still has these settings
        properties = json.loads((schema / "notification.json").read_text())["properties"]
        assert {"fetchNews", "checkForUpdates"} <= set(properties)


def test_the_devcontainer_runs_the_quick_start():
    """A laptop that cannot install opens the course in a Codespace or VS Code's Dev Containers: the
    container's commands are start.py's own, with options start.py accepts."""
    config = json.loads((COURSE_ROOT / ".devcontainer" / "devcontainer.json").read_text())
    commands = [config["postCreateCommand"], config["postAttachCommand"]]
    assert all(command.startswith("python3 start.py") for command in commands)
    for command in commands:
        start.build_parser().parse_args(command.split()[2:])  # argparse exits on an unknown option
    assert "--no-browser" in config["postAttachCommand"] and 8888 in config["forwardPorts"]
    version = re.search(r":(\d+)\.(\d+)", config["image"])
    assert (int(version.group(1)), int(version.group(2))) >= start.MIN_PYTHON


# ----------------------------------------------------------------------------- the README's two lines, two shells
SHELLS = ["bash", "zsh"]


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory):
    """The course's files (no .venv, no .git), with the environment CI's `python3 start.py test` made."""
    copy = tmp_path_factory.mktemp("course") / "ddpcourse"
    shutil.copytree(COURSE_ROOT, copy, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", ".ipynb_checkpoints", "*.saved-*.py"))
    if (COURSE_ROOT / ".venv" / "ddpcourse-setup.json").exists():
        os.symlink(COURSE_ROOT / ".venv", copy / ".venv")
    return copy


@pytest.mark.parametrize("shell", SHELLS)
def test_the_readme_quick_start_runs_under(shell, fresh_copy):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here (.ci/run installs it)")
    first, second = quick_start_lines()
    env = dict(os.environ, BROWSER="true")  # webbrowser runs `true URL`: no browser opens on this machine
    env.pop("VIRTUAL_ENV", None)
    began = time.monotonic()
    with socket.socket() as holder:  # a second JupyterLab on 8888: start.py must pick another port
        try:
            holder.bind(("127.0.0.1", 8888))
            holder.listen()
        except OSError:
            pass
        lab = subprocess.Popen([shell, "-c", first], cwd=fresh_copy, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, url = [], None
            while url is None and time.monotonic() - began < 240:
                line = lab.stdout.readline()
                if not line:
                    break
                output.append(line)
                # the address printed is notebook 00's, not the Launcher's (what a --no-browser learner clicks)
                url = re.search(r"(http://127\.0\.0\.1:(\d+)/lab/tree/clean/00_start_here\.ipynb\?token=(\w+))", line)
            assert url, "".join(output)
            port, token = url.group(2), url.group(3)
            assert port != "8888"
            answered = None
            while answered is None and time.monotonic() - began < 240:
                try:
                    notebook = f"http://127.0.0.1:{port}/api/contents/clean/00_start_here.ipynb?token={token}"
                    with urllib.request.urlopen(notebook, timeout=5) as response:
                        answered = json.load(response)
                except OSError:
                    time.sleep(0.5)
            seconds = time.monotonic() - began
        finally:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.communicate()
    text = "".join(output)
    assert answered and answered["type"] == "notebook", text
    assert "0 failed: ready for the course." in text  # the doctor ran, its all_reduce included
    print(f"{shell}: `{first}` to JupyterLab answering: {seconds:.1f} s")
    # the second line runs pytest in the same environment; PYTEST_ADDOPTS narrows it to one quick test
    tests = subprocess.run([shell, "-c", second], cwd=fresh_copy, capture_output=True, text=True, timeout=300,
                           env=dict(env, PYTEST_ADDOPTS="-n 0 tests/test_start.py -k "
                                                       "test_each_supported_system_gets_its_torch"))
    assert tests.returncode == 0 and "5 passed" in tests.stdout, tests.stdout + tests.stderr
    assert str(fresh_copy) in tests.stdout  # rootdir: the copy's tests ran, not this checkout's


def test_the_repository_names_no_package_index_but_pytorchs_cpu_index():
    # learners get PyTorch's CPU index (README); machines with their own pip configuration say "pip"
    tracked = subprocess.run(["git", "ls-files"], cwd=COURSE_ROOT, capture_output=True, text=True).stdout.split()
    hosts = re.compile(r"https?://([\w.-]+)/(?:simple|whl)\b|https?://(pypi\.org|[\w.-]*pythonhosted\.org)")
    named = {}
    for name in tracked:
        path = COURSE_ROOT / name
        if path.suffix in (".py", ".md", ".txt", ".toml", ".yml", ".json", ".cfg", ".sh", "") and path.is_file():
            for found in hosts.finditer(path.read_text(errors="replace")):
                named.setdefault(found.group(1) or found.group(2), set()).add(name)
    assert {host for host in named if not host.endswith(".example")} == {"download.pytorch.org"}, named
