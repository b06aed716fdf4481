"""Benchmark of expert parallelism on msrun: K ranks, each holding E/K routed experts whole, against tensor
parallelism over the same K ranks (every expert's 1/K slice), one MoE layer in bfloat16.

For each shape, one msrun job of K ranks builds three blocks per rank with seeded random weights: ``tp``
(PackedMoE with tp_size K), ``ep-replicated`` and ``ep-sharded`` (ep_size K, the two dispatchers of
``ms_swiglu.parallel``, sharing their weights), and times them interleaved in one loop per token count T (every
rank runs the same calls in the same order: their collectives pair). It reports, per rank:

    weights    the bytes each block holds, against the single process (every expert whole) and the goal of
               expert parallelism: the routed experts / K plus the replicated parts (router, shared expert)
    rows       the (token, slot) rows each rank's experts compute under the layer's routing (random router
               weights and inputs: no checkpoint's routing), i.e. the load balance
    bytes      per token communicated by all ranks together, by the collectives' ring algorithms, at the model's
               dtype (the CPU collectives carry bfloat16 as float32: twice that), against the minimum of any
               algorithm: each token's hidden vector sent from its home rank (the sharded row block it belongs
               to) to the other ranks that hold one of its top-k experts, and their results back
    time       min / median ms per call, and the ranks' median ratio ep / tp (paired by round). The K ranks share
               the host's cores: a ratio says how the work and the collectives compare on that host, not what K
               devices do

Usage: python -m ms_swiglu.tools.bench_ep [--shape qwen3-30b-a3b deepseek-v3-64e] [--tokens 1 16 256]
                                          [--ranks 2] [--rounds 5] [--json F]
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

from ms_swiglu.layout import own_rows, row_blocks

# (hidden_size, moe_intermediate_size, experts, top_k, shared expert intermediate size, router options)
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, 0, {}),
    # DeepSeek-V3 with 64 of its 256 experts (and 8 groups of 8): the whole layer fits beside its two ranks
    "deepseek-v3-64e": (7168, 2048, 64, 8, 2048, {"scoring": "sigmoid", "n_group": 8, "topk_group": 4,
                                                   "routed_scaling_factor": 2.5}),
    "tiny": (64, 32, 8, 2, 32, {}),
}
ITEMSIZE = 2  # bfloat16
WORKER = os.path.abspath(__file__)


def _nbytes(cell):
    return sum(int(np.prod(p.shape)) * p.data.itemsize for _, p in cell.parameters_and_names())


def _routed(cell):
    return sum(int(np.prod(p.shape)) * p.data.itemsize for n, p in cell.parameters_and_names()
               if n.startswith("experts."))


def communication(ids, experts, ranks, hidden, itemsize=ITEMSIZE):
    """Bytes per token each way of moving tokens, all ranks together, for the routing ``ids`` [T, k]."""
    tokens = len(ids)
    home = np.repeat(np.arange(ranks), [len(b) for b in row_blocks(tokens, ranks)[0]])
    holders = ids // (experts // ranks)  # [T, k]: the rank of each chosen expert
    away = [len(set(row.tolist()) - {h}) for row, h in zip(holders, home)]
    row = hidden * itemsize
    padded = row_blocks(tokens, ranks)[1]  # each rank's rows, padded to the largest block
    all_reduce = 2 * (ranks - 1) * tokens * row  # ring AllReduce of [T, H]: 2 (K-1)/K of it sent by each rank
    return {"minimum": 2 * row * float(np.mean(away)),
            "ep_replicated": all_reduce / tokens,
            "ep_sharded": (ranks * (ranks - 1) * padded * row  # AllGather of [T/K, H]: each rank's rows to K-1
                           + 2 * (ranks - 1) * ranks * padded * row) / tokens,  # AllReduce of [K T/K, H]
            "tp": all_reduce / tokens}


def worker(shape, tokens, rounds, out):
    """One rank: build, measure, and (rank 0) write the results as JSON to ``out``."""
    import mindspore as ms  # noqa: PLC0415

    from ms_swiglu import PackedMoE, parallel  # noqa: PLC0415
    from ms_swiglu.initial import empty_weights  # noqa: PLC0415
    from ms_swiglu.tools.timing import interleave, paired  # noqa: PLC0415

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    hidden, inter, experts, k, shared, router = SHAPES[shape]
    ranks = int(os.environ.get("MS_WORKER_NUM", "2"))
    rank = parallel.init(ranks)
    kw = dict(dtype=ms.bfloat16, backend="cpu", shared_intermediate_size=shared, **router)
    with empty_weights():  # the single process's block: its sizes only, nothing allocated
        whole = PackedMoE(hidden, inter, experts, k, **kw)
        single = _nbytes(whole), _routed(whole)
    ms.set_seed(0)  # the same weights on every rank: the replicated router routes every token alike
    blocks = {"tp": PackedMoE(hidden, inter, experts, k, tp_size=ranks, **kw),
              "ep-replicated": PackedMoE(hidden, inter, experts, k, ep_size=ranks, ep_rank=rank, **kw)}
    with empty_weights():
        blocks["ep-sharded"] = PackedMoE(hidden, inter, experts, k, ep_size=ranks, ep_rank=rank, dispatch="sharded",
                                         **kw)
    params = dict(blocks["ep-replicated"].parameters_and_names())
    for name, p in blocks["ep-sharded"].parameters_and_names():
        p.set_data(params[name])  # the same weights: memory for one expert-parallel block
    for name, b in blocks.items():
        x = ms.Tensor(shape=[None, hidden], dtype=ms.bfloat16)
        b.set_inputs(*([x, ms.Tensor(shape=[1], dtype=ms.int32)] if name == "ep-sharded" else [x]))
    memory = {"single_process": single[0], "single_routed": single[1],
              "goal": single[1] // ranks + single[0] - single[1],
              "tp": _nbytes(blocks["tp"]), "ep": _nbytes(blocks["ep-replicated"])}
    results = []
    for n in tokens:
        x32 = np.random.default_rng(n).standard_normal((n, hidden)).astype(np.float32)  # the same on every rank
        x = ms.Tensor(x32).astype(ms.bfloat16)
        own, count = own_rows(x32, ranks, rank)
        own, count = ms.Tensor(own).astype(ms.bfloat16), ms.Tensor([count], ms.int32)
        calls = {"tp": lambda: blocks["tp"](x).asnumpy(),
                 "ep-replicated": lambda: blocks["ep-replicated"](x).asnumpy(),
                 "ep-sharded": lambda: blocks["ep-sharded"](own, count).asnumpy()}
        stats = interleave(calls, rounds, warmup=2, settle=0)
        _, ids = blocks["ep-replicated"].router(x)
        ids = ids.asnumpy()
        rows = np.bincount((ids // (experts // ranks)).ravel(), minlength=ranks)
        results.append({"tokens": n, "times": {v: {"min_s": s["min_s"], "median_s": s["median_s"],
                                                   "spread": s["spread"]} for v, s in stats.items()},
                        "ep_over_tp": {v: paired(stats, v, "tp")["median"] for v in ("ep-replicated",
                                                                                           "ep-sharded")},
                        "rows_per_rank": rows.tolist(),
                        "bytes_per_token": communication(ids, experts, ranks, hidden)})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"shape": shape, "hidden": hidden, "inter": inter, "experts": experts, "top_k": k,
                       "shared": shared, "ranks": ranks, "memory": memory, "results": results}, f)


def run(args):
    from ms_swiglu.launch.msrun import Job  # noqa: PLC0415

    out = []
    for shape in args.shape:
        with Job(args.ranks) as job:
            path = os.path.join(job.work, "result.json")
            job.run(WORKER, ["rank", shape, "--rounds", str(args.rounds), "--out", path, "--tokens",
                             *map(str, args.tokens)])
            with open(path) as f:
                res = json.load(f)
        out.append(res)
        _print(res)
    return {"ranks": args.ranks, "dtype": "bfloat16", "results": out}


def _print(res):
    m, mib = res["memory"], 2 ** 20
    print(f"\n{res['shape']}: H={res['hidden']} I={res['inter']} E={res['experts']} k={res['top_k']} shared "
          f"I={res['shared']}, {res['ranks']} ranks, bfloat16")
    print(f"weights per rank: ep {m['ep'] / mib:.0f} MiB = {m['ep'] / m['single_process']:.3f} of one process "
          f"({m['single_process'] / mib:.0f} MiB; goal {m['goal'] / mib:.0f} MiB = "
          f"{m['goal'] / m['single_process']:.3f}); tp {m['tp'] / mib:.0f} MiB")
    head = (f"{'T':>4} | {'tp ms':>15} {'ep-rep ms':>15} {'ep-shd ms':>15} | {'rep/tp':>6} {'shd/tp':>6} | "
            f"{'rows per rank':>15} | {'bytes/token: min':>16} {'rep':>7} {'shd':>7} {'tp':>7}")
    print(head + "\n" + "-" * len(head))
    for r in res["results"]:
        t, b = r["times"], r["bytes_per_token"]
        ms_ = " ".join(f"{t[v]['min_s'] * 1e3:6.1f}/{t[v]['median_s'] * 1e3:8.1f}" for v in
                       ("tp", "ep-replicated", "ep-sharded"))
        ratio = r["ep_over_tp"]
        print(f"{r['tokens']:4d} | {ms_} | {ratio['ep-replicated']:6.2f} {ratio['ep-sharded']:6.2f} | "
              f"{'/'.join(map(str, r['rows_per_rank'])):>15} | {b['minimum']:16.0f} {b['ep_replicated']:7.0f} "
              f"{b['ep_sharded']:7.0f} {b['tp']:7.0f}", flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "rank":  # one rank of the job (a word: msrun takes option prefixes as its own)
        p = argparse.ArgumentParser()
        p.add_argument("shape")
        p.add_argument("--tokens", nargs="+", type=int)
        p.add_argument("--rounds", type=int)
        p.add_argument("--out")
        a = p.parse_args(argv[1:])
        worker(a.shape, a.tokens, a.rounds, a.out)
        return 0
    from ms_swiglu.tools.timing import write_json  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["qwen3-30b-a3b", "deepseek-v3-64e"], choices=sorted(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 256])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = run(args)
    data["args"] = vars(args)
    data["date"] = started
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
