"""How many threads each rank gets: the cores this process may really use, divided among the ranks.

This module never imports torch: the launcher process uses it.
"""
import math
import os
from pathlib import Path


def usable_cores():
    """The cores this process may really use: its CPU affinity, capped by its container's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def cgroup_cpu_quota(root="/sys/fs/cgroup", self_cgroup="/proc/self/cgroup"):
    """CPUs granted by the tightest cgroup quota on this process's own cgroup path, None when unlimited.

    v2: cpu.max of its cgroup (``0::/path`` in /proc/self/cgroup) and of every parent up to ``root`` (a
    limit set on a parent, e.g. a systemd slice, binds too); v1: cfs_quota/cfs_period of its cpu cgroup
    and parents. A path missing under ``root`` (a container's own cgroup mount) only drops that level."""
    v2, v1 = "/", "/"
    try:
        for line in Path(self_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2 = path
            elif "cpu" in controllers.split(","):
                v1 = path
    except (OSError, ValueError):
        pass

    def up_to_root(base, path):
        folder = Path(base, path.strip("/"))
        while True:
            yield folder
            if folder == Path(base):
                return
            folder = folder.parent

    found, quotas = False, []
    for folder in up_to_root(root, v2):
        try:
            quota, period = Path(folder, "cpu.max").read_text().split()[:2]
            found = True
            if quota != "max":
                quotas.append(int(quota) / int(period))
        except (OSError, ValueError):
            continue
    if not found:  # no v2 cpu controller: cgroup v1
        for folder in up_to_root(Path(root, "cpu"), v1):
            try:
                quota = int(Path(folder, "cpu.cfs_quota_us").read_text())
                period = int(Path(folder, "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


def threads_per_rank(ranks, environ=None):
    """OMP_NUM_THREADS for each of ``ranks`` processes on this machine: the user's value if set, else the
    usable cores divided among the ranks (more threads each would only fight over the cores)."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS"):
        return environ["OMP_NUM_THREADS"]
    return str(max(1, usable_cores() // ranks))
