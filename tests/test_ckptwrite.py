"""The workloads' checkpoint writer digests every file while writing it
(workloads.common.ckptwrite): a save's commit reads nothing back, and its manifest is what hashing
the files on disk gives; a file it did not write (a stale one in the step dir) is still hashed into
the manifest."""

from __future__ import annotations

import os
import types

from launchers import ckptptr


def test_manifest_from_digests_taken_while_writing(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist

    from workloads.common.checkpoint import Checkpointer
    from workloads.common.stateful import ModelOptimState

    read_back = []
    digest = ckptptr._digest
    monkeypatch.setattr(
        ckptptr,
        "_digest",
        lambda p, a="sha256": (read_back.append(os.path.basename(p)), digest(p, a))[1],
    )
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 64)).sum().backward()
        opt.step()
        ckpt = Checkpointer(
            types.SimpleNamespace(rank=0, world_size=1, checkpoint_dir=str(tmp_path / "ck"))
        )
        states = {"app": ModelOptimState(model, opt)}
        os.makedirs(tmp_path / "ck" / "step-00000002")
        # an earlier attempt's
        (tmp_path / "ck" / "step-00000002" / "__7_0.distcp").write_bytes(b"stale")
        ckpt.save(1, states, {})
        ckpt.save_async(2, states, {})
        ckpt.close()
    finally:
        dist.destroy_process_group()
    assert read_back == ["__7_0.distcp"]
    for name in ("step-00000001", "step-00000002"):
        man = ckptptr._read_manifest(str(tmp_path / "ck" / name / ckptptr.MANIFEST))
        assert sorted(man) == sorted(set(os.listdir(tmp_path / "ck" / name)) - {ckptptr.MANIFEST})
        assert ckptptr.check(str(tmp_path / "ck"), name).state == "complete"
    assert ckptptr.read_latest(str(tmp_path / "ck")) == "step-00000002"
