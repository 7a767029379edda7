"""The offline wheel folder: one folder that installs the course on Linux x86_64 (WSL2 too) and on macOS
arm64, for Python 3.10 to 3.13, with no network (`python3 start.py --wheels DIR`).

    python docs/workshop/wheels.py build DIR     # download every target's wheels into DIR (needs network)
    python docs/workshop/wheels.py check DIR     # resolve every target from DIR alone; exit 1 on a gap

One folder serves every laptop: pip picks the wheel whose tags fit the machine, and the pure-Python
wheels are shared. `pip download --platform --python-version` fetches another system's wheels, with one
trap: pip evaluates dependency markers for the machine it runs on. So torch is fetched without its
dependencies, and its dependencies are read from its own wheel and evaluated for the target here.
Linux's torch comes from the PyPI CPU index (`--torch-index`, or `--torch-from DIR` with wheels you have).
"""
import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

COURSE = Path(__file__).resolve().parents[2]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class Target:
    """One system: its pip platform tags (newest first) and the marker environment its laptops have."""

    def __init__(self, name, platforms, system, machine, sys_platform, extra=()):
        self.name, self.platforms, self.extra = name, platforms, extra
        self.wheel_words = ("linux" if system == "Linux" else "macosx", machine)
        self.markers = {"platform_system": system, "platform_machine": machine, "sys_platform": sys_platform,
                        "os_name": "posix", "implementation_name": "cpython",
                        "platform_python_implementation": "CPython", "extra": ""}

    def environment(self, python):
        return dict(self.markers, python_version=python, python_full_version=python + ".0")


TARGETS = (
    Target("linux-x86_64", ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
           "Linux", "x86_64", "linux"),
    # appnope: ipykernel needs it on macOS only, so a resolver running on Linux never asks for it
    Target("macos-arm64", ("macosx_14_0_arm64", "macosx_11_0_arm64", "macosx_10_13_universal2",
                           "macosx_10_9_universal2"), "Darwin", "arm64", "darwin", extra=("appnope",)),
)


def requirements(target, python):
    """requirements.txt for one target: markers evaluated for it (Python 3.10 has its own pins), without
    torch and without the course itself (`-e .` installs from the course folder)."""
    wanted = []
    for line in (COURSE / "requirements.txt").read_text().splitlines():
        if not line.strip() or line.startswith(("#", "-e")):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(target.environment(python)):
            requirement.marker = None
            wanted.append(str(requirement))
    torch = next(line for line in wanted if line.startswith("torch=="))
    # setuptools: installing the course itself (`-e .`) builds it
    return torch, [line for line in wanted if line != torch] + ["setuptools"] + list(target.extra)


def target_options(target, python):
    options = ["--python-version", python, "--only-binary=:all:", "--implementation", "cp"]
    for platform in target.platforms:
        options += ["--platform", platform]
    return options


def torch_wheel(folder, target, python, torch):
    tag = "cp" + python.replace(".", "")
    for wheel in sorted(Path(folder).glob(f"torch-{torch.split('==')[1]}*-{tag}-*.whl")):
        if all(word in wheel.name for word in target.wheel_words):
            return wheel
    return None


def torch_dependencies(wheel, target, python):
    """torch's Requires-Dist whose markers hold on the target (nvidia-* only for PyPI's Linux build)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    kept = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(target.environment(python)):
            requirement.marker = None
            kept.append(str(requirement))
    return kept


def pip(*args):
    return subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True)


def build(folder, torch_index, torch_from):
    folder.mkdir(parents=True, exist_ok=True)
    failures = []
    for target in TARGETS:
        for python in PYTHONS:
            torch, rest = requirements(target, python)
            options = target_options(target, python)
            if torch_from and target.name.startswith("linux"):
                for wheel in Path(torch_from).glob("torch-*.whl"):
                    shutil.copy(wheel, folder)
            elif target.name.startswith("linux"):
                # "pip" (as start.py takes it): no index argument, pip's own configuration decides
                index = [] if torch_index == "pip" else ["--index-url", torch_index]
                done = pip("download", torch, "--no-deps", *index, *options, "-d", str(folder))
                if done.returncode:
                    failures.append(f"{target.name} Python {python}: torch: {last_line(done)}")
            else:  # macOS: PyPI's torch is the CPU one
                done = pip("download", torch, "--no-deps", *options, "-d", str(folder))
                if done.returncode:
                    failures.append(f"{target.name} Python {python}: torch: {last_line(done)}")
            wheel = torch_wheel(folder, target, python, torch)
            needs = rest + (torch_dependencies(wheel, target, python) if wheel else [])
            done = pip("download", *needs, *options, "--find-links", str(folder), "-d", str(folder))
            if done.returncode:
                failures.append(f"{target.name} Python {python}: {last_line(done)}")
            print(f"{target.name} Python {python}: {'ok' if not done.returncode else 'FAILED'}", flush=True)
    return failures


def check(folder):
    """Each target resolved from the folder alone, for the target's own Python (`pip download` into the
    folder itself copies nothing: every file is there already); the gaps, named."""
    gaps = []
    for target in TARGETS:
        for python in PYTHONS:
            torch, rest = requirements(target, python)
            wheel = torch_wheel(folder, target, python, torch)
            if wheel is None:
                gaps.append(f"{target.name} Python {python}: no {torch} wheel")
                continue
            needs = rest + torch_dependencies(wheel, target, python)
            done = pip("download", "--no-index", "--find-links", str(folder), "-d", str(folder),
                       *target_options(target, python), *needs)
            if done.returncode:
                gaps.append(f"{target.name} Python {python}: {last_line(done)}")
    return gaps


def last_line(done):
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return re.sub(r"\s+", " ", lines[-1]) if lines else f"pip exited {done.returncode}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--torch-index", default=os.environ.get("DDPCOURSE_TORCH_INDEX_URL", CPU_INDEX))
    parser.add_argument("--torch-from", help="a folder of Linux torch wheels to copy instead of downloading")
    options = parser.parse_args(argv)
    problems = build(options.folder, options.torch_index, options.torch_from) if options.action == "build" else []
    problems += check(options.folder)
    wheels = list(options.folder.glob("*.whl"))
    print(f"{len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB in {options.folder}")
    for target in TARGETS:
        for python in PYTHONS:
            gap = [p for p in problems if p.startswith(f"{target.name} Python {python}")]
            print(f"{target.name:13} Python {python}: {'MISSING ' + gap[0].split(': ', 1)[1] if gap else 'covered'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
