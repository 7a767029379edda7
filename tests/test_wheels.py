"""docs/workshop/wheels.py, the offline wheel folder: which systems and Pythons it covers, the pins each
Python gets, torch's dependencies evaluated for the target rather than for this machine, and `check`
finding a gap with real pip on a folder of tiny wheels."""
import importlib.util
import zipfile

import pytest

from ddpcourse.learner.doctor import pins
from ddpcourse.paths import COURSE_ROOT

spec = importlib.util.spec_from_file_location("wheels", COURSE_ROOT / "docs" / "workshop" / "wheels.py")
wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheels)
TARGETS = {target.name: target for target in wheels.TARGETS}


def load_start():
    spec = importlib.util.spec_from_file_location("start", COURSE_ROOT / "start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_folder_covers_linux_x86_64_and_macos_arm64_for_every_python_start_py_accepts():
    assert set(TARGETS) == {"linux-x86_64", "macos-arm64"}
    first = ".".join(map(str, load_start().MIN_PYTHON))
    assert wheels.PYTHONS[0] == first and wheels.PYTHONS[-1] == "3.13" and len(wheels.PYTHONS) == 4


@pytest.mark.parametrize("python", wheels.PYTHONS)
def test_each_python_gets_the_pins_the_doctor_expects_for_it(python):
    torch, rest = wheels.requirements(TARGETS["linux-x86_64"], python)
    expected = {name: version for name, version in pins(python=python).items()}
    got = dict(line.split("==") for line in [torch] + rest if "==" in line)
    assert got == expected
    assert "appnope" in wheels.requirements(TARGETS["macos-arm64"], python)[1]  # ipykernel's, macOS only


def fake_wheel(folder, filename, name, version, requires=()):
    """A minimal wheel pip accepts: METADATA, WHEEL and RECORD."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {line}\n" for line in requires)
    with zipfile.ZipFile(folder / filename, "w") as archive:
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return folder / filename


def test_torchs_dependencies_are_evaluated_for_the_target_not_for_this_machine(tmp_path):
    wheel = fake_wheel(tmp_path, "torch-2.13.0-cp311-none-macosx_14_0_arm64.whl", "torch", "2.13.0", [
        "filelock", 'nvidia-nccl-cu12==2.99; platform_system == "Linux" and platform_machine == "x86_64"'])
    assert wheels.torch_dependencies(wheel, TARGETS["macos-arm64"], "3.11") == ["filelock"]
    assert wheels.torch_dependencies(wheel, TARGETS["linux-x86_64"], "3.11") == ["filelock", "nvidia-nccl-cu12==2.99"]


def test_check_resolves_from_the_folder_alone_and_names_the_gap(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "TARGETS", (TARGETS["macos-arm64"],))
    monkeypatch.setattr(wheels, "PYTHONS", ("3.11",))
    monkeypatch.setattr(wheels, "requirements", lambda target, python: ("torch==2.13.0", ["ddpc-tiny==1.0"]))
    fake_wheel(tmp_path, "torch-2.13.0-cp311-none-macosx_14_0_arm64.whl", "torch", "2.13.0", ["ddpc-dep"])
    fake_wheel(tmp_path, "ddpc_tiny-1.0-py3-none-any.whl", "ddpc-tiny", "1.0")
    dep = fake_wheel(tmp_path, "ddpc_dep-2.0-py3-none-any.whl", "ddpc-dep", "2.0")
    assert wheels.check(tmp_path) == []
    dep.unlink()
    gaps = wheels.check(tmp_path)
    assert len(gaps) == 1 and gaps[0].startswith("macos-arm64 Python 3.11:") and "ddpc-dep" in gaps[0], gaps
    monkeypatch.setattr(wheels, "PYTHONS", ("3.12",))
    assert wheels.check(tmp_path) == ["macos-arm64 Python 3.12: no torch==2.13.0 wheel"]
