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
        assert torch.serialization.get_crc32_options()  # the user's torch.save keeps its CRC
        ckpt.save_async(2, states, {})
        ckpt.close()
        import torch.distributed.checkpoint as dcp

        want = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        dcp.load(states, checkpoint_id=str(tmp_path / "ck" / "step-00000001"))
        assert all(torch.equal(model.state_dict()[k], want[k]) for k in want)
    finally:
        dist.destroy_process_group()
    # the synchronous save skips the zip records' CRC32 (torch.load never checks it); the async
    # one, in a background thread while training runs, leaves torch's process-wide setting alone
    assert zip_crcs(tmp_path / "ck" / "step-00000001") == {0}
    assert 0 not in zip_crcs(tmp_path / "ck" / "step-00000002")
    assert read_back == ["__7_0.distcp"]
    for name in ("step-00000001", "step-00000002"):
        man = ckptptr._read_manifest(str(tmp_path / "ck" / name / ckptptr.MANIFEST))
        assert sorted(man) == sorted(set(os.listdir(tmp_path / "ck" / name)) - {ckptptr.MANIFEST})
        assert ckptptr.check(str(tmp_path / "ck"), name).state == "complete"
    assert ckptptr.read_latest(str(tmp_path / "ck")) == "step-00000002"


def zip_crcs(step_dir) -> set:
    """The CRC32 fields of the zip records (central directory headers) in a step's data files."""
    crcs = set()
    for f in step_dir.glob("*.distcp"):
        b, i = f.read_bytes(), 0
        while (i := b.find(b"PK\x01\x02", i)) >= 0:
            crcs.add(int.from_bytes(b[i + 16 : i + 20], "little"))
            i += 4
    assert crcs, f"no zip record in {step_dir}"
    return crcs
