"""Run the FFN of one checkpoint layer on an input and report it: what ``ms-swiglu run`` does in its process, and
what every rank of a tensor-parallel job does (``ms_swiglu.launch.worker``)."""
import statistics
import time
import zipfile

import numpy as np

from ms_swiglu import paths, signals
from ms_swiglu.errors import InputError
from ms_swiglu.outputs import write_file


def available_memory():
    """Bytes this machine can still allocate (MemAvailable), or None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(what, nbytes):
    """InputError, before anything is allocated, when ``nbytes`` exceed the memory available."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise InputError(f"{what}: expected a size that fits in memory ({free / 1e9:.1f} GB available), got one "
                         f"needing {nbytes / 1e9:.1f} GB")


def layer_bytes(config, layer, tokens):
    """Bytes a call of the layer on ``tokens`` float32 tokens allocates at least (input, output, activations)."""
    inter = config.moe.intermediate_size * config.moe.top_k if config.is_moe_layer(layer) else config.intermediate_size
    return 4 * tokens * (2 * config.hidden_size + 3 * inter)


def read_input(path, hidden):
    """A float ``.npy`` array of shape [..., hidden] as float32; its header is checked before the data is read."""
    if not path:
        raise InputError("input: expected a .npy file name, got an empty string")
    paths.input_file(path, "input")
    try:
        with open(path, "rb") as f:
            if zipfile.is_zipfile(f):
                raise InputError(f"input: expected a .npy array, got a .npz archive at {path}")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read_header:
                raise ValueError(f"npy format version {version}")
            shape, _, dtype = read_header[version](f)
    except FileNotFoundError:
        raise InputError(f"input: expected a .npy file, found none at {path}") from None
    except InputError:
        raise
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"input: expected a .npy array, got unreadable {path} ({exc or 'empty file'})") from None
    if not np.issubdtype(dtype, np.floating):
        raise InputError(f"input: expected a float array, got dtype {dtype}")
    if len(shape) < 1 or shape[-1] != hidden:
        raise InputError(f"input: expected shape [..., {hidden}] (hidden_size), got {list(shape)}")
    check_fits("input", int(np.prod(shape, dtype=np.float64)) * (dtype.itemsize + 4))
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"input: expected a .npy array, got unreadable {path} ({exc})") from None
    return x.astype(np.float32)


def save_npy(path, array, force=False):
    """``np.save`` as one whole file: a new one, or with ``force`` a replaced one (``ms_swiglu.outputs``)."""
    write_file(path, lambda tmp: _save(tmp, array), force)


def _save(path, array):
    with open(path, "wb") as f:
        np.save(f, array)


def run_layer(checkpoint, layer, x, *, dtype=None, backend="auto", repeat=3, tp_size=1, output=None,
              force=False, quant=None, ep_size=1, dispatch="replicated"):
    """Build the layer's FFN of ``checkpoint`` (a path or an open checkpoint, ``ms_swiglu.checkpoint.open_checkpoint``;
    this rank's part of it, having joined the launched group when tp_size or ep_size > 1), run
    it on ``x`` [..., H], print the result line and, on rank 0, write the output as float32 ``.npy``. A backend
    without dynamic shapes (akg) is compiled for the shape of ``x``. With ``ep_size`` K > 1 and ``dispatch``
    "sharded", rank r takes the r-th of K contiguous row blocks of ``x`` as its own tokens, and rank 0 gathers
    every rank's output rows in the input's order."""
    import mindspore as ms  # noqa: PLC0415 -- after the input checks: importing MindSpore takes seconds

    from ms_swiglu.backends import resolve  # noqa: PLC0415
    from ms_swiglu.checkpoint.load import load_block  # noqa: PLC0415
    from ms_swiglu.checkpoint.source import open_checkpoint  # noqa: PLC0415
    from ms_swiglu.mlp import param_dtype  # noqa: PLC0415

    device = ms.get_context("device_target")  # the installed MindSpore's default: Ascend or CPU
    ms.set_device(device)
    ms.set_context(mode=ms.GRAPH_MODE)
    backend = resolve(backend)
    if not backend.runs_on(device):
        raise InputError(f"--backend {backend.name}: expected a backend that runs on this machine's device "
                         f"{device}, got one for {backend.device}")
    from ms_swiglu import parallel  # noqa: PLC0415

    rank = parallel.init(tp_size * ep_size) if tp_size * ep_size > 1 else 0
    checkpoint = open_checkpoint(checkpoint)
    config = checkpoint.config
    mlp = load_block(checkpoint, layer, dtype=dtype, backend=backend, tp_size=tp_size, rank=rank, quant=quant,
                     ep_size=ep_size, dispatch=dispatch)
    ms_dtype = param_dtype(mlp)
    moe = config.is_moe_layer(layer)  # (a dense layer of an expert-parallel job: whole on every rank)
    if ep_size > 1 and parallel.DISPATCH[dispatch].own_tokens:
        call = _ShardedCall(mlp, x, ms_dtype, ep_size, rank, moe)
    else:
        call = _WholeCall(mlp, x, ms_dtype)
    if backend.dynamic_shapes:
        mlp.set_inputs(*call.specs)
    y = call()  # compiles
    signals.pause_point("graph")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        y = call()
        times.append((time.perf_counter() - t0) * 1e3)
    y = call.output(y)
    if rank != 0:
        return y
    block = f"MoE {config.num_local_experts} experts top-{config.num_experts_per_tok}" if config.is_moe_layer(
        layer) else "MLP"
    split = f", tp {tp_size}" if tp_size > 1 else f", ep {ep_size} ({dispatch} tokens)" if ep_size > 1 else ""
    weights = f", weights {mlp.quant}" if mlp.quant else ""
    print(f"device {device}{split}, backend {mlp.backend.name}, dtype {str(ms_dtype).lower()}{weights}, {block} "
          f"layer {layer} of {config.model_type}, input {list(x.shape)} -> output {list(y.shape)}, latency "
          f"{statistics.median(times):.3f} ms (median of {repeat}, min {min(times):.3f})", flush=True)
    if output:
        save_npy(output, y, force)
        print(f"wrote {output}", flush=True)
    return y


class _WholeCall:
    """The block on all of ``x`` (every rank the same tokens); its input Tensors are made once, outside the timed
    calls."""

    def __init__(self, mlp, x, dtype):
        import mindspore as ms  # noqa: PLC0415

        self.mlp, self.shape = mlp, x.shape
        self.specs = (ms.Tensor(shape=[None] * (x.ndim - 1) + [x.shape[-1]], dtype=dtype),)
        self.args = (ms.Tensor(x).astype(dtype),)

    def __call__(self):
        return self.mlp(*self.args)

    def output(self, y):
        import mindspore as ms  # noqa: PLC0415

        return y.astype(ms.float32).asnumpy()


class _ShardedCall(_WholeCall):
    """Rank ``rank`` of ``ep_size`` on its own tokens: the r-th of K contiguous row blocks of ``x`` [..., H],
    padded to the largest block (at least 1 row, so that every rank joins the collectives); the output rows of
    every rank are gathered (AllGather) and put back in the input's order. A dense layer (``moe`` False) computes
    its own rows alone."""

    def __init__(self, mlp, x, dtype, ep_size, rank, moe):
        import mindspore as ms  # noqa: PLC0415

        from ms_swiglu.layout import own_rows, row_blocks  # noqa: PLC0415
        from ms_swiglu.parallel import AllGatherRows  # noqa: PLC0415

        self.mlp, self.shape, flat = mlp, x.shape, x.reshape(-1, x.shape[-1])
        self.blocks, self.rows = row_blocks(len(flat), ep_size)
        own, count = own_rows(flat, ep_size, rank)
        self.specs = (ms.Tensor(shape=[None, flat.shape[1]], dtype=dtype),)
        self.args = (ms.Tensor(own).astype(dtype),)
        if moe:  # a MoE block takes the count of real rows
            self.specs += (ms.Tensor(shape=[1], dtype=ms.int32),)
            self.args += (ms.Tensor([count], ms.int32),)
        self.gather = AllGatherRows()

    def output(self, y):
        import mindspore as ms  # noqa: PLC0415

        rows = self.gather(y.astype(ms.float32)).asnumpy().reshape(len(self.blocks), self.rows, -1)  # [K, T_pad, H]
        out = np.concatenate([rows[r, :len(b)] for r, b in enumerate(self.blocks)])
        return out.reshape(self.shape)
