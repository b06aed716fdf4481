"""``ms-swiglu export --ep-size K``: one MindIR and kit per expert-parallel rank of a MoE layer, exported under
msrun so that each rank's graph holds its own collectives (``ms_swiglu.parallel``: AllReduce, and AllGather for
sharded tokens).

    OUT/manifest.json            the set: ranks, dispatch, communication group, the verify command
    OUT/verify_on_device.py      under msrun, rank r verifies OUT/rank{r}
    OUT/rank{r}/                 rank r's kit (its MindIR, golden cases, manifest), as a single export writes it

The golden cases come from the whole layer once, in the exporting process (float32 from exactly the weights the
ranks hold), before msrun starts; each rank's golden outputs are its part of them. Each rank's twin (the same
dispatcher and collectives, between the msrun processes) is held against them by the acceptance criterion; where
the graphs run on the exporting device (``portable`` on the CPU), the reloaded MindIRs of all ranks run together
too. The whole set is one ``FolderSet``: the ranks write into its staging folder, and it is put in place only
when every rank succeeded.

MindSpore names the world group of a CPU job ``mccl_world_group`` and that of an Ascend job ``hccl_world_group``.
An ``ascend`` export made on a CPU renames its collectives' group to the latter (what the same export on an
Ascend host records); each rank's manifest says which group its graph names and what ran with it.
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys

import numpy as np

from ms_swiglu.errors import InputError
from ms_swiglu.layout import own_rows, row_blocks

CPU_GROUP, HCCL_GROUP = "mccl_world_group", "hccl_world_group"
WORKER = os.path.abspath(__file__)


class ShardedFeed:
    """Rank ``rank`` of ``ep_size`` with its own tokens: the r-th of K contiguous row blocks of a case's tokens,
    padded to the largest block (at least one row), and ``tokens`` [1] int32, its real rows."""

    names = ("x", "tokens")
    zero_tokens = ("in the graph: a rank with no tokens passes one padded row and tokens = 0, and joins every "
                   "collective")

    def __init__(self, hidden, ep_size, rank):
        self.hidden, self.ep_size, self.rank = hidden, ep_size, rank

    def specs(self, dtype):
        return [([-1, self.hidden], dtype), ([1], "int32")]

    def inputs(self, x):
        own, count = own_rows(x.reshape(-1, self.hidden), self.ep_size, self.rank)
        return own, np.array([count], np.int32)

    def rows(self, y, tokens):
        flat = y.reshape(-1, self.hidden)
        own, count = own_rows(flat, self.ep_size, self.rank)
        mine = row_blocks(len(flat), self.ep_size)[0][self.rank]
        ambiguous = [int(t) - int(mine[0]) for t in tokens if count and t in mine]
        return own, ambiguous + list(range(count, len(own)))  # padded rows: not compared

    def case(self, inputs):
        return {"tokens_input": int(inputs[1][0])}


def _communication(rank, ep_size, dispatch, backend, device):
    """The callback that names the world group of a rank's MindIR for ``backend``'s device and returns the
    manifest's entry."""
    from ms_swiglu.export.mindir import collectives, rename_group  # noqa: PLC0415

    def name_groups(path):
        exported = collectives(path)[0]["group"]
        group = HCCL_GROUP if backend.device == "Ascend" else exported
        if group != exported:
            rename_group(path, exported, group)
        checked = f"the twin's collectives ran between {device} processes under msrun"
        if group != exported:
            checked += (f"; renamed from {exported} to the world group MindSpore creates on Ascend, not loaded under "
                        f"HCCL")
        return {"rank": rank, "ep_size": ep_size, "dispatch": dispatch, "group": group, "exported_as": exported,
                "collectives": collectives(path), "checked": checked}

    return name_groups


def golden(req, path):
    """The golden cases of ``req`` (one MoE layer) from the whole layer, in this one process, saved to ``path``
    (.npz): the ranks take their parts, so the whole layer is held once. ``req.dtype`` and ``req.quant`` are
    settled to the layer's."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu.checkpoint.load import load_block  # noqa: PLC0415
    from ms_swiglu.export.exporter import check_host, golden_net, settle_request  # noqa: PLC0415
    from ms_swiglu.export.golden import golden_cases, save_cases  # noqa: PLC0415

    _, chip = check_host(req)
    ms.set_context(mode=ms.GRAPH_MODE)
    whole = load_block(req.checkpoint, req.layers[0], dtype=req.dtype, backend="composite", quant=req.quant)
    settle_request(req, whole, chip)
    save_cases(path, golden_cases(req, whole.hidden_size, golden_net(req, whole), whole))


def export_rank(req, stage, ep_size, dispatch, golden_path):
    """This rank's MindIR and kit in the folder ``stage``/rank{r} (run by every rank of the msrun job), its
    golden outputs its part of the cases at ``golden_path``."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu import backends, parallel  # noqa: PLC0415
    from ms_swiglu.checkpoint.load import load_block  # noqa: PLC0415
    from ms_swiglu.export.exporter import (  # noqa: PLC0415
        TARGETS, Feed, check_host, settle_request, twin_backend, write_kit, write_manifest)
    from ms_swiglu.export.golden import load_cases  # noqa: PLC0415
    from ms_swiglu.export.verify_on_device import verify  # noqa: PLC0415

    rank = parallel.init(ep_size)
    device, chip = check_host(req)
    ms.set_context(mode=ms.GRAPH_MODE)
    layer, config, backend = req.layers[0], _config(req), backends.get(TARGETS[req.target])
    ep = {"ep_size": ep_size, "rank": rank, "dispatch": dispatch}
    net = load_block(req.checkpoint, layer, dtype=req.dtype, backend=backend, quant=req.quant, **ep)
    settle_request(req, net, chip)
    runs_here = backend.runs_on(device)
    twin = net if runs_here else load_block(req.checkpoint, layer, dtype=req.dtype,
                                            backend=twin_backend(req, device), quant=req.quant, **ep)
    hidden = config.hidden_size
    sharded = parallel.DISPATCH[dispatch].own_tokens
    feed = ShardedFeed(hidden, ep_size, rank) if sharded else Feed([-1, -1, hidden])
    kit = os.path.join(stage, f"rank{rank}")
    os.makedirs(kit)
    manifest = write_kit(req, kit, net, hidden, config.intermediate_size, config.model_type, device, chip,
                         feed=feed, twin=twin, cases=load_cases(golden_path),
                         comm=_communication(rank, ep_size, dispatch, backend, device),
                         allowed=net.dispatch.graph_ops | backend.facts.partial_ops)
    if runs_here:  # the reloaded MindIRs of every rank, run together
        lines = []
        if verify(kit, device, calls=1, out=lines.append) != 0:
            raise RuntimeError(f"export: expected rank {rank}'s reloaded MindIR to pass the acceptance criterion, "
                               f"got {lines[-1] if lines else 'no result'}")
        manifest["verification"]["reloaded"] = lines
        manifest["checked"]["golden"] = f"reloaded MindIR on {device}, every rank together under msrun"
        write_manifest(kit, manifest)
    return manifest


def _config(req):
    from ms_swiglu.checkpoint import read_config  # noqa: PLC0415

    return read_config(req.checkpoint)


def check_request(req, ep_size, dispatch):
    """InputError for an expert-parallel export that cannot be made, before msrun starts."""
    from ms_swiglu import backends  # noqa: PLC0415
    from ms_swiglu.checkpoint.source import open_checkpoint  # noqa: PLC0415
    from ms_swiglu.export.exporter import TARGETS  # noqa: PLC0415
    from ms_swiglu.layout import DISPATCHES  # noqa: PLC0415

    if not req.checkpoint or req.stack:
        raise InputError("--ep-size: expected --checkpoint and --layer N (one MoE layer), got "
                         f"{'--preset' if req.preset else '--layers'}")

    def splits(backend):  # graphs that deploy, with experts that run on an expert-parallel rank
        return bool(backend.facts.deployable) and backend.facts.expert_parallel

    if req.target not in TARGETS or not splits(backends.get(TARGETS[req.target])):
        deployable = [t for t, b in TARGETS.items() if splits(backends.get(b))]
        raise InputError(f"--ep-size: expected --target {' or '.join(deployable)} (graphs that deploy), got "
                         f"{req.target}")
    if req.air or req.static_shape:
        raise InputError(f"--ep-size: expected a dynamic MindIR, got {'--air' if req.air else '--static-shape'}")
    if dispatch not in DISPATCHES:
        raise InputError(f"--dispatch: expected one of {', '.join(DISPATCHES)}, got {dispatch!r}")
    ckpt = open_checkpoint(req.checkpoint)
    layer = req.layers[0]
    ckpt.config.check_layer(layer)
    if not ckpt.config.is_moe_layer(layer):
        raise InputError(f"--layer: expected a MoE layer for --ep-size (a dense layer is whole on every rank: export "
                         f"it without --ep-size), got dense layer {layer} of {ckpt.config.model_type!r}")
    ckpt.check([layer], 1, req.quant, ep_size)


def export_ep(req, ep_size, dispatch, master_port=None):
    """Export every rank's kit of ``req`` (one MoE layer) with ``ep_size`` expert-parallel ranks; returns the
    set's manifest."""
    from ms_swiglu.export.exporter import KIT_SCRIPT, write_manifest  # noqa: PLC0415
    from ms_swiglu.launch.msrun import Job  # noqa: PLC0415
    from ms_swiglu.outputs import FolderSet  # noqa: PLC0415

    check_request(req, ep_size, dispatch)
    req = dataclasses.replace(req, checkpoint=os.path.abspath(req.checkpoint))  # the ranks run in the job folder
    kits = [f"rank{r}" for r in range(ep_size)]
    with FolderSet(req.output_dir, [k + "/" for k in kits] + ["manifest.json", "verify_on_device.py"], req.force,
                   label="--output-dir", noun="export", manifest="manifest.json") as out:
        with Job(ep_size, master_port) as job:
            cases = os.path.join(job.work, "golden.npz")
            golden(req, cases)  # settles req's dtype and weight format for the ranks
            request = os.path.join(job.work, "request.json")
            with open(request, "w") as f:
                json.dump(dataclasses.asdict(req), f)
            job.run(WORKER, ["--request", request, "--stage", out.stage, "--ep-size", str(ep_size),
                             "--dispatch", dispatch, "--golden", cases])
        ranks = []
        for kit in kits:
            with open(os.path.join(out.stage, kit, "manifest.json")) as f:
                ranks.append(json.load(f))
        shutil.copyfile(KIT_SCRIPT, os.path.join(out.stage, "verify_on_device.py"))
        first = ranks[0]
        device = "CPU" if first["communication"]["group"] == CPU_GROUP else "Ascend"
        manifest = {
            "name": first["name"], "target": req.target, "dtype": first["dtype"], "ep_size": ep_size,
            "dispatch": dispatch, "moe": first["moe"], "weights": first["weights"],
            "ranks": [{"rank": r, "kit": kit + "/", "model_file": m["model_file"], "op_types": m["op_types"],
                       "inputs": m["inputs"], "checked": m["checked"]} for r, (kit, m) in enumerate(zip(kits, ranks))],
            "communication": {k: first["communication"][k] for k in ("group", "exported_as", "checked")},
            "verify_command": (f"msrun --worker_num={ep_size} --local_worker_num={ep_size} --master_port=8118 "
                               f"--log_dir=verify_logs --join=True verify_on_device.py --device {device}"),
            "files": {},
        }
        write_manifest(out.stage, manifest)
        out.commit()
    return manifest


def main(argv=None):
    """One rank of the export job (msrun starts it): ``--request`` JSON, the set's staging folder."""
    from ms_swiglu.export.exporter import ExportRequest  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="ms_swiglu.export.parallel")
    p.add_argument("--request", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--ep-size", type=int, required=True)
    p.add_argument("--dispatch", required=True)
    p.add_argument("--golden", required=True)
    args = p.parse_args(argv)
    with open(args.request) as f:
        fields = json.load(f)
    req = ExportRequest(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    export_rank(req, args.stage, args.ep_size, args.dispatch, args.golden)
    return 0


if __name__ == "__main__":
    sys.exit(main())
