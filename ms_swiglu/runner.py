"""Run the FFN of one checkpoint layer on an input and report it: what ``ms-swiglu run`` does in its process, and
what every rank of a tensor-parallel job does (``ms_swiglu.launch.worker``)."""
import os
import statistics
import time

import numpy as np

from ms_swiglu.errors import InputError


def read_input(path, hidden):
    """A float ``.npy`` array of shape [..., hidden] as float32."""
    try:
        x = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input: expected a .npy file, found none at {path}") from None
    except (ValueError, OSError) as exc:
        raise InputError(f"input: expected a .npy array, got unreadable {path} ({exc})") from None
    if not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"input: expected a float array, got dtype {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != hidden:
        raise InputError(f"input: expected shape [..., {hidden}] (hidden_size), got {list(x.shape)}")
    return x.astype(np.float32)


def save_npy(path, array):
    """``np.save`` to a temporary file, renamed into place."""
    tmp = f"{path}.tmp{os.getpid()}.npy"
    try:
        np.save(tmp, array)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def run_layer(checkpoint, layer, x, *, config, dtype=None, backend="auto", repeat=3, tp_size=1, output=None):
    """Build the layer's FFN (this rank's part of it, having joined the launched group when tp_size > 1), run
    it on ``x`` [..., H], print the result line and, on rank 0, write the output as float32 ``.npy``."""
    import mindspore as ms  # noqa: PLC0415 -- after the input checks: importing MindSpore takes seconds

    from ms_swiglu.checkpoint.load import load_block  # noqa: PLC0415
    from ms_swiglu.mlp import param_dtype  # noqa: PLC0415

    device = ms.get_context("device_target")  # the installed MindSpore's default: Ascend or CPU
    ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    rank = 0
    if tp_size > 1:
        from ms_swiglu import parallel  # noqa: PLC0415

        rank = parallel.init(tp_size)
    mlp = load_block(checkpoint, layer, dtype=dtype, backend=backend, tp_size=tp_size, rank=rank)
    ms_dtype = param_dtype(mlp)
    mlp.set_inputs(ms.Tensor(shape=[None] * (x.ndim - 1) + [config.hidden_size], dtype=ms_dtype))
    xt = ms.Tensor(x).astype(ms_dtype)
    y = mlp(xt)  # compiles
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        y = mlp(xt)
        times.append((time.perf_counter() - t0) * 1e3)
    y = y.astype(ms.float32).asnumpy()
    if rank != 0:
        return y
    block = f"MoE {config.num_local_experts} experts top-{config.num_experts_per_tok}" if config.is_moe_layer(layer) else "MLP"
    tp = f", tp {tp_size}" if tp_size > 1 else ""
    print(f"device {device}{tp}, backend {mlp.backend.name}, dtype {str(ms_dtype).lower()}, {block} layer {layer} "
          f"of {config.model_type}, input {list(x.shape)} -> output {list(y.shape)}, latency "
          f"{statistics.median(times):.3f} ms (median of {repeat}, min {min(times):.3f})", flush=True)
    if output:
        save_npy(output, y)
        print(f"wrote {output}", flush=True)
    return y
