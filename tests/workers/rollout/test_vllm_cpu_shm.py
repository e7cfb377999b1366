"""vLLM's CPU shared-memory names (rlvr.workers.rollout.vllm_cpu_shm): the group's names are removed
once its engine is up, other groups' and other programs' names are left alone."""

from __future__ import annotations

from rlvr.workers.rollout.vllm_cpu_shm import SHM_TAG, release_cpu_shm_names


def test_release_removes_only_this_groups_names(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "29511")
    ours = [f"{SHM_TAG}29511--tp:0-[0-1]-cpushm_{rank}" for rank in (0, 1)]
    others = [f"{SHM_TAG}29512--tp:0-[0-1]-cpushm_0", f"{SHM_TAG}295110--tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_0", "psm_1234", f"{SHM_TAG}29511-notes"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(release_cpu_shm_names(tmp_path)) == ours
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(others)
    assert release_cpu_shm_names(tmp_path) == []  # the other rank finds them gone
    assert release_cpu_shm_names(tmp_path / "missing") == []
