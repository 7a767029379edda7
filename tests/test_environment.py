"""The install: pinned versions agree everywhere, and the README's commands are the ones CI runs."""
import ast
import importlib
import re
import subprocess
import sys

from ddpcourse.__main__ import main as ddpcourse_main
from ddpcourse.learner.doctor import KERNEL_PACKAGES, check_environment, format_report, pins
from ddpcourse.paths import COURSE_ROOT, lab_files

README = (COURSE_ROOT / "README.md").read_text()


def conda_pip_pins():
    text = (COURSE_ROOT / "environment.yml").read_text()
    return {name.lower(): version for name, version in re.findall(r"^\s*-\s*([A-Za-z0-9_.-]+)==(\S+)\s*$", text, re.M)}


def test_environment_yml_and_requirements_pin_the_same_versions():
    required = pins()
    assert set(required) == {"torch", "jupyterlab", "nbval", "ipywidgets", "matplotlib", "pytest", "psutil",
                             "pytest-xdist", "import-linter"}
    assert conda_pip_pins() == required


def test_torch_is_pinned_exactly_so_no_newer_cuda_build_is_pulled():
    assert re.fullmatch(r"\d+\.\d+\.\d+", pins()["torch"])
    assert re.search(rf"^\s*torch=={re.escape(pins()['torch'])}\s*$", (COURSE_ROOT / "requirements.txt").read_text(), re.M)


PYPROJECT = (COURSE_ROOT / "pyproject.toml").read_text()


def toml_library():
    """tomllib (Python 3.11+), else tomli when installed, else None (Python 3.10: read_simple_toml)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    return tomllib


STRING_OR_COMMENT = re.compile(r'("(?:[^"\\]|\\.)*"|\'[^\']*\')|#.*')


def read_simple_toml(text):
    """The subset of TOML that pyproject.toml uses, for Python 3.10 without tomli: [tables] and [dotted.tables],
    `key = value` with strings, numbers and (multi-line) arrays of them, comments. Anything else is an error,
    never a silent skip."""
    data, table, pending = {}, None, ""
    for line in text.splitlines():
        line = STRING_OR_COMMENT.sub(lambda m: m.group(1) or "", line).strip()
        if not line:
            continue
        header = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
        if header and not pending:
            table = data
            for part in header.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        pending += " " + line
        unquoted = STRING_OR_COMMENT.sub("", pending)
        if unquoted.count("[") > unquoted.count("]"):
            continue  # an array that goes on over the next lines
        key, value = (part.strip() for part in pending.split("=", 1))
        assert re.fullmatch(r"[A-Za-z0-9_-]+", key) and table is not None, f"not simple TOML: {pending!r}"
        table[key] = ast.literal_eval(value)
        pending = ""
    assert not pending, f"unfinished TOML value: {pending!r}"
    return data


def pyproject():
    library = toml_library()
    return library.loads(PYPROJECT) if library else read_simple_toml(PYPROJECT)


def test_the_python_3_10_toml_reader_reads_pyproject_as_tomllib_does():
    """The fallback is checked against a real TOML parser wherever one exists (Python 3.11+ always has it)."""
    project = read_simple_toml(PYPROJECT)["project"]
    assert project["dependencies"] and project["optional-dependencies"] and project["scripts"]
    library = toml_library()
    if library is not None:
        assert read_simple_toml(PYPROJECT) == library.loads(PYPROJECT)
    else:  # Python 3.10 without tomli: no reference parser, so at least the reader's own rules on a sample
        sample = '[a]\nx = "1 # not a comment" # a comment\n[a.b]\ny = [\n  "p",  # one\n  "q",\n]\n'
        assert read_simple_toml(sample) == {"a": {"x": "1 # not a comment", "b": {"y": ["p", "q"]}}}


def test_pyproject_declares_supported_ranges_that_hold_every_pin_and_the_cli_script():
    from packaging.requirements import Requirement

    project = pyproject()["project"]  # tomllib, tomli or the Python 3.10 reader: never skipped
    declared = [Requirement(text) for text in project["dependencies"]]
    declared += [Requirement(text) for group in project["optional-dependencies"].values() for text in group]
    ranges = {req.name.lower(): req.specifier for req in declared}
    assert set(ranges) == set(pins()) | set(KERNEL_PACKAGES)  # every pinned package, nothing else
    for python in ("3.10", "3.11", "3.12", "3.13"):  # Python 3.10 has pins of its own (markers)
        for package, version in pins(python=python).items():
            assert version in ranges[package], f"{python}: {package}=={version} outside {ranges[package]}"
            assert str(ranges[package]), f"{package}: a range, not 'anything'"
    assert pins(python="3.10") != pins(python="3.11")
    assert {Requirement(text).name for text in project["dependencies"]} == set(KERNEL_PACKAGES)
    # `ddpcourse` (the console script) is `python -m ddpcourse`: both call ddpcourse.__main__.main
    module, function = project["scripts"]["ddpcourse"].split(":")
    assert getattr(importlib.import_module(module), function) is ddpcourse_main
    cli = subprocess.run([sys.executable, "-m", "ddpcourse", "status", "--line"], capture_output=True, text=True,
                         cwd=COURSE_ROOT, timeout=60)
    assert cli.returncode == 0 and cli.stdout.startswith("ddpcourse "), cli.stderr


def test_ci_runs_the_readme_test_command_which_is_the_quick_starts_second_line():
    command = re.search(r"<!-- test-command -->\s*```\w*\s*\n(.+?)\n```", README, re.S).group(1).strip()
    quick_start = re.search(r"<!-- quick-start -->\s*```bash\n(.*?)```", README, re.S).group(1).splitlines()
    assert command == quick_start[1] and command in (COURSE_ROOT / ".ci" / "run").read_text().splitlines()


def environment_yml():
    """environment.yml's channels and its pip list, read line by line (its YAML is this plain subset)."""
    channels, pip, section = [], [], None
    for line in (COURSE_ROOT / "environment.yml").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.split(":")[0]
            continue
        item = line.strip().removeprefix("- ").strip()
        if section == "channels":
            channels.append(item)
        elif section == "dependencies" and line.startswith("      "):
            pip.append(item)
        elif section == "dependencies" and item != "pip:":
            channels.append(("conda", item))
    return channels, pip


def test_environment_yml_uses_conda_forge_only_and_the_cpu_torch_index_first():
    """`conda env create -f environment.yml` as written: no default channels (their terms-of-service prompt
    stops new users), pip with the PyTorch CPU index before any package, so Linux gets the CPU build."""
    channels, pip = environment_yml()
    assert [c for c in channels if isinstance(c, str)] == ["conda-forge", "nodefaults"]
    conda_packages = dict(item.split("=", 1) if "=" in item else (item, "") for _, item in
                          [c for c in channels if isinstance(c, tuple)])
    assert set(conda_packages) == {"python", "pip"}
    assert tuple(map(int, conda_packages["python"].split("."))) >= (3, 10)
    assert pip[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert pip[-1] == "-e ." and len(pip) == len(pins()) + 2


def test_readme_installs_by_hand_cpu_torch_first_in_lines_zsh_can_paste():
    """Each by-hand block: the CPU torch before requirements.txt (Linux), and no trailing `# comment`
    (zsh without interactivecomments passes `#` and the words after it to the command)."""
    by_hand = README[README.index("## Install by hand"):README.index("## Course map")]
    blocks = re.findall(r"```bash\n(.*?)```", by_hand, re.S)
    assert blocks and not [line for block in blocks for line in block.splitlines() if "#" in line]
    linux = next(block for block in blocks if "apt install" in block)
    assert "sudo apt update" in linux and "python3-venv" in linux
    assert linux.index("whl/cpu") < linux.index("-r requirements.txt")
    assert "conda env create -f environment.yml" in by_hand
    assert "python -m jupyter lab --ServerApp.root_dir=. clean/00_start_here.ipynb" in by_hand
    assert (COURSE_ROOT / "clean" / "00_start_here.ipynb").is_file()
    for system in ("**Linux", "**macOS on Apple Silicon", "**conda**"):
        assert system in by_hand
    quick = README[README.index("## Quick start"):README.index("## Install by hand")]
    assert "**Windows: WSL2.**" in quick and "wsl --install" in quick and "**Intel Macs**" in quick
    assert "cd ddpcourse-main" in quick  # the folder a GitHub zip unpacks to


def test_readme_course_map_lists_every_notebook_and_its_lab():
    for notebook in sorted((COURSE_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"notebooks/{notebook.name}" in README
        number = notebook.name[:2]
        lab = next(p for p in lab_files(COURSE_ROOT / "labs") if p.name.startswith(f"{number}_"))
        assert f"labs/{lab.name}" in README


def test_doctor_reports_this_machine_ready_and_explains_each_failure(monkeypatch):
    report = check_environment(launch=False)  # the notebook's doctor cell does the real all_reduce
    assert report.ok, format_report(report, color=False)
    assert report.row("torch").status == "OK" and report.row("backend gloo").status == "OK"
    # a wrong version is a red line with its fix
    monkeypatch.setattr("ddpcourse.learner.doctor.pins", lambda path=None: {"torch": "9.9.9", "nbval": "0.11.0"})
    wrong = check_environment(launch=False)
    assert not wrong.ok
    text = format_report(wrong, color=False)
    assert "FAIL  torch" in text and "the course is tested with 9.9.9" in text
    assert "fix: pip install torch==9.9.9 --index-url https://download.pytorch.org/whl/cpu" in text
    assert text.rstrip().endswith("NOT ready: apply the fixes above.")


def test_doctor_fails_on_kernel_packages_and_only_informs_on_tooling(monkeypatch):
    """A JupyterLab (or pytest, nbval) from another environment must not block notebook 00."""
    kernel = {package: "0.0.1" for package in KERNEL_PACKAGES}
    tooling = {"jupyterlab": "0.0.1", "nbval": "0.0.1", "pytest": "0.0.1"}
    monkeypatch.setattr("ddpcourse.learner.doctor.pins", lambda path=None: tooling)
    report = check_environment(launch=False)
    assert report.ok and {report.row(p).status for p in tooling} == {"INFO"}
    assert "fine if it runs from another environment" in report.row("jupyterlab").value
    monkeypatch.setattr("ddpcourse.learner.doctor.pins", lambda path=None: kernel)
    report = check_environment(launch=False)
    assert not report.ok and {report.row(p).status for p in kernel} == {"FAIL"}
