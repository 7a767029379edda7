"""The install: pinned versions agree everywhere, and the README's commands are the ones CI runs."""
import importlib
import re
import subprocess
import sys

import pytest

from ddpcourse.__main__ import main as ddpcourse_main
from ddpcourse.doctor import KERNEL_PACKAGES, check_environment, format_report, pins
from ddpcourse.paths import COURSE_ROOT, lab_files

README = (COURSE_ROOT / "README.md").read_text()


def conda_pip_pins():
    text = (COURSE_ROOT / "environment.yml").read_text()
    return {name.lower(): version for name, version in re.findall(r"^\s*-\s*([A-Za-z0-9_.-]+)==(\S+)\s*$", text, re.M)}


def test_environment_yml_and_requirements_pin_the_same_versions():
    required = pins()
    assert set(required) == {"torch", "jupyterlab", "nbval", "ipywidgets", "matplotlib", "pytest", "psutil"}
    assert conda_pip_pins() == required


def test_torch_is_pinned_exactly_so_no_newer_cuda_build_is_pulled():
    assert re.fullmatch(r"\d+\.\d+\.\d+", pins()["torch"])
    assert re.search(rf"^\s*torch=={re.escape(pins()['torch'])}\s*$", (COURSE_ROOT / "requirements.txt").read_text(), re.M)


def test_pyproject_declares_supported_ranges_that_hold_every_pin_and_the_cli_script():
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((COURSE_ROOT / "pyproject.toml").read_text())["project"]
    declared = [Requirement(text) for text in project["dependencies"]]
    declared += [Requirement(text) for group in project["optional-dependencies"].values() for text in group]
    ranges = {req.name.lower(): req.specifier for req in declared}
    assert set(ranges) == set(pins()) | set(KERNEL_PACKAGES)  # every pinned package, nothing else
    for package, version in pins().items():
        assert version in ranges[package], f"requirements.txt pins {package}=={version} outside {ranges[package]}"
        assert str(ranges[package]), f"{package}: a range, not 'anything'"
    assert {Requirement(text).name for text in project["dependencies"]} == set(KERNEL_PACKAGES)
    # `ddpcourse` (the console script) is `python -m ddpcourse`: both call ddpcourse.__main__.main
    module, function = project["scripts"]["ddpcourse"].split(":")
    assert getattr(importlib.import_module(module), function) is ddpcourse_main
    cli = subprocess.run([sys.executable, "-m", "ddpcourse", "status", "--line"], capture_output=True, text=True,
                         cwd=COURSE_ROOT, timeout=60)
    assert cli.returncode == 0 and cli.stdout.startswith("ddpcourse "), cli.stderr


def test_ci_runs_the_readme_test_command():
    command = re.search(r"<!-- test-command -->\s*```\w*\s*\n(.+?)\n```", README, re.S).group(1).strip()
    assert command in (COURSE_ROOT / ".ci" / "run").read_text()


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
    monkeypatch.setattr("ddpcourse.doctor.pins", lambda path=None: {"torch": "9.9.9", "nbval": "0.11.0"})
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
    monkeypatch.setattr("ddpcourse.doctor.pins", lambda path=None: tooling)
    report = check_environment(launch=False)
    assert report.ok and {report.row(p).status for p in tooling} == {"INFO"}
    assert "fine if it runs from another environment" in report.row("jupyterlab").value
    monkeypatch.setattr("ddpcourse.doctor.pins", lambda path=None: kernel)
    report = check_environment(launch=False)
    assert not report.ok and {report.row(p).status for p in kernel} == {"FAIL"}
