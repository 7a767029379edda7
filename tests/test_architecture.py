"""The package's layers hold: import-linter's contracts (.importlinter), and a broken layer is caught."""
import shutil
import subprocess
import sys

from ddpcourse.paths import COURSE_ROOT

LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"]
CONTRACTS = ("Layers:", "What the labs import", "The launcher's process never imports torch",
             "The product holds no test machinery")


def lint(root):
    return subprocess.run(LINT, cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": "", "HOME": str(root)})


def test_every_contract_is_kept():
    done = lint(COURSE_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in CONTRACTS:
        assert f"{name}" in done.stdout.replace("\n", " ")
    assert "4 kept, 0 broken" in done.stdout


def test_a_launcher_that_imports_torch_and_a_checks_module_that_uses_the_learner_tools_are_caught(tmp_path):
    shutil.copytree(COURSE_ROOT / "ddpcourse", tmp_path / "ddpcourse", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(COURSE_ROOT / ".importlinter", tmp_path)
    with open(tmp_path / "ddpcourse" / "launch" / "launcher.py", "a") as f:
        f.write("\nimport torch  # noqa\n")
    with open(tmp_path / "ddpcourse" / "checks" / "lab00.py", "a") as f:
        f.write("\nfrom ddpcourse.learner import progress  # noqa\n")
    with open(tmp_path / "ddpcourse" / "launch" / "stacks.py", "a") as f:  # the siblings stay apart
        f.write("\nfrom ddpcourse.authoring import makelabs  # noqa\n")
    with open(tmp_path / "ddpcourse" / "todos.py", "a") as f:  # the floor reads nothing above it
        f.write("\nfrom ddpcourse.launch import events  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "ddpcourse.launch.launcher is not allowed to import torch" in done.stdout
    assert "ddpcourse.checks.lab00 -> ddpcourse.learner.progress" in done.stdout
    assert "ddpcourse.launch.stacks -> ddpcourse.authoring.makelabs" in done.stdout
    assert "ddpcourse.todos -> ddpcourse.launch.events" in done.stdout
