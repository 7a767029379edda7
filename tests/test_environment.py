"""The install: pinned versions agree everywhere, and the README's commands are the ones CI runs."""
import re

from ddpcourse.doctor import check_environment, format_report, pins
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
    assert pins()["torch"] == "2.13.0"
    assert re.search(r"^\s*torch==2\.13\.0\s*$", (COURSE_ROOT / "requirements.txt").read_text(), re.M)
    pyproject = (COURSE_ROOT / "pyproject.toml").read_text()
    assert "dependencies = []" in pyproject  # installing the package never replaces the chosen torch


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
