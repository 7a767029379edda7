"""compare_replicas: the helper every later lab uses to tell whether model replicas are identical.

One 3-rank launch covers: identical replicas (plain and DDP-wrapped), a parameter edited on one rank,
a buffer that differs, and a layer that exists on one rank only."""
import textwrap

from ddpcourse.launch.launcher import run

SCRIPT = textwrap.dedent("""
    import torch, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddpcourse import init_distributed, report
    from ddpcourse.lab import compare_replicas

    rank, world, device = init_distributed()

    def model():
        torch.manual_seed(0)  # the same seed on every rank: the same weights
        return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))

    same = model()
    report(same=compare_replicas(same).as_dict(), wrapped=compare_replicas(DDP(model())).as_dict())

    edited = model()
    with torch.no_grad():
        if rank == 2:
            edited[0].weight[0, 0] += 0.5   # a parameter edited on rank 2 only
        if rank == 1:
            edited[1].running_mean += 0.25  # a buffer that differs on rank 1
    edited_report = compare_replicas(edited)
    report(edited=edited_report.as_dict(), edited_text=str(edited_report))

    grown = model()
    if rank == 1:
        grown.append(nn.Linear(1, 1))  # a layer added on one rank only
    report(grown=compare_replicas(grown).as_dict())
    torch.distributed.destroy_process_group()
    """)


def test_compare_replicas_names_what_differs_where_and_by_how_much(tmp_path):
    path = tmp_path / "replicas.py"
    path.write_text(SCRIPT)
    result = run(path, nproc=3, timeout=60, show="none")
    assert result.ok, result.message
    for rank in range(3):  # every rank gets the same verdict
        same = result.reports[rank]["same"]
        assert same["identical"] and same["differences"] == [] and same["structure"] == []
        assert result.reports[rank]["wrapped"]["identical"]  # DDP's broadcast keeps them identical

        edited = result.reports[rank]["edited"]
        assert not edited["identical"]
        by_name = {d["name"]: d for d in edited["differences"]}
        assert set(by_name) == {"0.weight", "1.running_mean"}
        assert by_name["0.weight"]["kind"] == "parameter"
        assert by_name["0.weight"]["groups"] == [[0, 1], [2]]
        assert abs(by_name["0.weight"]["max_abs_diff"] - 0.5) < 1e-6
        assert by_name["1.running_mean"]["kind"] == "buffer"
        assert by_name["1.running_mean"]["groups"] == [[0, 2], [1]]
        assert abs(by_name["1.running_mean"]["max_abs_diff"] - 0.25) < 1e-6

        grown = result.reports[rank]["grown"]
        assert not grown["identical"]
        assert any(msg.startswith("3.weight: rank 0 has None, rank 1 has") for msg in grown["structure"])
    text = result.reports[0]["edited_text"]
    assert text.startswith("replicas DIFFER")
    assert "parameter 0.weight: 2 versions (ranks 0,1 vs ranks 2), max |diff| 0.5" in text
