"""The four settings the suite's notebook kernels and their ranks run under (conftest.py rotates them), so
that no committed output depends on the CPU's kernels or the thread count (issue 31). Test machinery only.

The committed outputs were made with the machine's own ATen kernels and the launcher's threads.
OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of spinning, so 4 threads per rank on 2 cores cost
scheduling only, not the digits.
ATEN_CPU_CAPABILITY=avx2 exists on x86 only (elsewhere torch warns into every rank's output): there the
kernel axis is plain kernels against the machine's own (unset, None here).
"""
import platform

_SECOND_KERNELS = "avx2" if platform.machine().lower() in ("x86_64", "amd64") else None
SETTINGS = [{"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
            {"ATEN_CPU_CAPABILITY": _SECOND_KERNELS, "OMP_NUM_THREADS": "4"},
            {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "4"},
            {"ATEN_CPU_CAPABILITY": _SECOND_KERNELS, "OMP_NUM_THREADS": "1"}]
for _setting in SETTINGS:
    _setting["OMP_WAIT_POLICY"] = "PASSIVE"
